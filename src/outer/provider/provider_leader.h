// A provider leader's side of the protocol (design §2, §7): joins, follows the head's rounds
// and updates (the rules are leader_rules.h), resynchronises after a head restart, and sends
// contributions. Only the leader (rank 0) of a provider has one; provider.cpp runs the rounds.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "common/config.h"
#include "common/layout.h"
#include "compress/decoder.h"
#include "compress/encoder.h"
#include "inner/data.h"
#include "net/protocol.h"
#include "net/transport.h"
#include "outer/provider/attack.h"
#include "outer/provider/leader_rules.h"
#include "outer/provider/link.h"
#include "outer/provider/provider.h"
#include "outer/round/downlink.h"
#include "outer/round/round.h"
#include "outer/round/sync.h"

namespace xloco::outer {

// BLAKE2b of a flat fp32 buffer: what HELLO and the saved state name a θ_pub by.
std::string flat_hash(const torch::Tensor& t);

class Leader {
 public:
  Leader(const common::Config& cfg, const ProviderOptions& opts, std::unique_ptr<net::Transport> t);

  // Sends HELLO with the hash of `theta_pub` (the model this provider built from the run's seed,
  // or loaded from the head's warm-start weights) and waits for WELCOME; returns the shard it
  // was given. The head sends the full state only when that is not its θ_pub (membership.h
  // sync_for): a provider joining a run at its start builds θ₀ itself and downloads nothing,
  // and one joining a round after it gets that round's update (before the WELCOME) instead.
  inner::Shard join(torch::Tensor& theta_pub, const common::FlatLayout& layout);

  // Waits for the head's next instruction, applying updates and resynchronising on the way.
  // Returns the round to run, or 0 to stop.
  uint64_t next_round(torch::Tensor& theta_pub, const common::FlatLayout& layout);

  // The head's messages that have come in within `wait` (none left waiting: 0), applied as
  // next_round applies them. The round to run (0: stop) once its ROUND_START is among them.
  std::optional<uint64_t> poll(torch::Tensor& theta_pub, const common::FlatLayout& layout,
                               std::chrono::milliseconds wait);

  // Sends δ (flat, CPU) for round r, its fragment's tensors only (outer.fragments); the
  // encoder keeps what it could not send as its residual.
  void contribute(uint64_t r, const torch::Tensor& delta, uint64_t tokens, double compute_s,
                  double train_loss);

  void progress(uint64_t round, uint64_t step, double tokens_per_s) {
    link_.set_progress(round, step, tokens_per_s);
  }
  bool take_fresh_state() { return std::exchange(fresh_state_, false); }
  void goodbye(const std::string& reason) { link_.post(net::Bye{reason}, state_.done_round); }
  bool stopped_by_signal() const { return stopped_by_signal_; }
  uint64_t done_round() const { return state_.done_round; }
  void set_contributed(uint64_t round) { contributed_ = round; }  // from a resumed saved state
  compress::Encoder& uplink() { return up_; }
  // The tensors round r syncs (sync.h): all of them unless outer.fragments > 1.
  const Fragment& fragment(uint64_t r) const {
    return fragments_[fragment_index(r, cfg_)];
  }
  double bytes_up() const { return bytes_up_; }
  double bytes_down() const { return bytes_down_; }  // updates and states received

 private:
  void hello(const std::string& hash);

  // The head restarted, declared this provider dead, or it missed updates: HELLO again with
  // the hash of the θ_pub it holds; the head answers with what it lacks (design §2). The
  // provider's ranks keep running; they wait in the next control broadcast.
  void resync(const torch::Tensor& theta_pub, const std::string& why);

  // θ_pub from the head: round r's update applied to it (its fragment's tensors), or a full
  // state in its place; both counted. Without what the update needs (a relayed update's own
  // frame), or when the result is not finite (which the head would not have sent), θ_pub is
  // left as it was and the reason returned (downlink.h).
  std::optional<std::string> take_update(const net::Update& u, uint64_t r, torch::Tensor& theta_pub);
  void take_state(const net::Frame& state, torch::Tensor& theta_pub, const common::FlatLayout& layout);

  void rejoined(const net::Envelope& env, torch::Tensor& theta_pub,
                const common::FlatLayout& layout, const std::string& why);

  void check_head_alive();

  void repeat_hello(double after_s) {
    if (std::chrono::duration<double>(Clock::now() - last_hello_).count() > after_s) hello(last_hash_);
  }

  const common::Config& cfg_;
  const ProviderOptions& opts_;
  Link link_;
  compress::Encoder up_;
  compress::Decoder dec_;
  std::unique_ptr<Downlink> downlink_ = make_downlink(cfg_);  // outer.downlink's provider side
  std::vector<Fragment> fragments_;  // outer.fragments' groups of this model (set at join)
  LeaderState state_;
  uint64_t tokens_ = 0;
  uint64_t contributed_ = 0;  // the last round it sent a contribution for
  bool fresh_state_ = false, head_quiet_ = false, stopped_by_signal_ = false;
  std::string last_hash_;
  Clock::time_point last_hello_{};
  double bytes_up_ = 0, bytes_down_ = 0;
  std::optional<Attack> attack_;  // XLOCO_ATTACK's for this provider (a test device)
};

}  // namespace xloco::outer
