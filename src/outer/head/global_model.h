// The head's model side (design §2, §8), with no network I/O: θ_true, θ_pub (the parameters of
// an evaluator that never trains), the outer momentum, the round's Aggregator, the codecs of
// the downlink and of full states; evaluation of θ_pub on the validation windows; and the head
// checkpoint, written atomically and verified against its hashes on resume. The event loop
// (head.cpp) hands it frames and sends what it returns.
//
// Evaluation runs on its own thread, so rounds go on while it does. θ_pub is only read
// meanwhile: the update of a round that closes during an evaluation waits, as its frame, and
// is applied when the evaluation ends (pub_round() is then one behind the rounds closed). A
// second round cannot close on a θ_pub one update behind, so the head ends the evaluation
// first, by cancelling it: a round never waits for an evaluation, but one that is slower than
// a round is skipped (and says so).
#pragma once

#include <atomic>
#include <exception>
#include <functional>
#include <optional>
#include <thread>
#include <utility>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "common/config.h"
#include "common/layout.h"
#include "compress/decoder.h"
#include "compress/encoder.h"
#include "inner/dist.h"
#include "inner/trainer.h"
#include "net/frame.h"
#include "net/protocol.h"
#include "outer/head/membership.h"
#include "outer/round/aggregate.h"
#include "outer/round/downlink.h"
#include "outer/round/outer_opt.h"
#include "outer/round/sync.h"
#include "outer/status/documents.h"

namespace xloco::outer {

class GlobalModel {
 public:
  // θ from the config's seed, or from `init` (a checkpoint directory) for a warm start.
  GlobalModel(const common::Config& config, const std::string& init);

  const common::FlatLayout& layout() const { return evaluator_->layout(); }
  // The tensors round r syncs (outer.fragments, sync.h): its contributions and its update
  // carry these alone, and its outer step moves only them.
  const Fragment& fragment(uint64_t round) const { return fragments_[fragment_index(round)]; }
  size_t fragment_index(uint64_t round) const { return outer::fragment_index(round, config_); }
  torch::Tensor& theta_pub() { return evaluator_->params(); }
  double param_bytes() const { return static_cast<double>(layout().bytes()); }
  // The largest codec frame of this model: every parameter in fp32 plus header and tables.
  std::int64_t max_frame_bytes() const { return layout().bytes() + (std::int64_t{1} << 20); }
  // The largest UPDATE, all its frames: the downlink codec's bytes per value, plus header and
  // tables (relay: every provider's uplink frame).
  std::int64_t max_update_bytes() const;
  // What `peer` is sent of round's `update` (close_round): the update itself, or with relay
  // the same frames without `peer`'s own when that is among them (downlink.h).
  net::Update update_for(const std::string& peer, const net::Update& update) const;

  // The round whose θ_pub is in memory, and its hash now and before the last update applied
  // (what rejoining providers are judged by).
  uint64_t pub_round() const { return pub_round_; }
  const std::string& pub_hash() const { return pub_hash_; }
  const std::string& prev_hash() const { return prev_hash_; }
  // Hashes θ_pub after an update: the head calls it once the next round is under way.
  void rehash();

  // θ_pub in full, fp32, for a provider that holds nothing usable. One encoding per θ_pub is
  // shared by every joiner while any send queue still holds it: K providers joining at once
  // cost one state frame of memory, not K.
  net::Frame full_state();
  // What a provider admitted to `shard` is sent, in order, each with its header round: the
  // last update applied (kUpdate), a WELCOME (with the full state for kFullState), and the
  // update still waiting to be applied, if an evaluation holds it back.
  std::vector<std::pair<uint64_t, net::Body>> join_messages(int shard, SyncAction sync);
  bool have_last_update() const { return !last_update_.empty(); }

  Aggregator& aggregator() { return aggregator_; }
  // Closes the round (design §2): Δ from the aggregator, θ_true ← OuterOpt(θ_true, Δ),
  // u ← Q_down(θ_true − θ_pub), θ_pub ← θ_pub + deq(u). With outer.downlink "relay", u is
  // the accepted uplink frames (relay.h), θ_true takes them as the providers do, and
  // θ_pub = θ_true (update_for leaves each provider's own out; downlink.h). Returns u, also kept
  // as last_update(), and the contributions that failed to decode at the last moment. A round
  // with nothing in Δ leaves θ_true alone and sends only the downlink residual.
  // While an evaluation runs, θ_pub keeps its value and the update waits (`deferred`); the
  // head must end that evaluation before the next round closes (has_pending()).
  // A round whose outer step would leave θ_true or the momentum non-finite is discarded: both
  // stay as they were (the update carries only the downlink residual), and `discarded` says
  // where and why. What poisons a round never reaches θ, θ_pub or a checkpoint.
  struct Closed {
    net::Update update;
    std::vector<Aggregator::Rejected> rejected;
    bool deferred = false;
    std::optional<std::string> discarded;
    std::vector<std::pair<std::string, double>> clipped;  // clip factors under 1 (aggregate.h)
    std::vector<std::pair<std::string, double>> scores;   // outer.score: loss change by provider
    int trust_scaled = 0;    // trained tensors outer.trust_region scaled (aggregate.h)
    double trust_ratio = 0;  // the largest ‖lr·Δₜ‖ / radius before scaling (0: no region)
    size_t accepted = 0;     // contributions in the step (0: θ is unchanged)
  };
  Closed close_round();
  bool has_pending() const { return !pending_.empty(); }

  // Starts evaluating θ_pub (round pub_round()) on the validation windows, on its own thread.
  void start_evaluation();
  bool evaluating() const { return eval_thread_.joinable(); }
  struct Evaluation {
    uint64_t round = 0;
    std::optional<inner::EvalStats> stats;  // none when cancelled
  };
  // The evaluation, once it has ended (or at once: waiting for it, or cancelling it at its
  // next batch), with θ_pub then brought up to date and rehashed; nullopt while it runs.
  std::optional<Evaluation> end_evaluation(bool wait, bool cancel);

  // ckpt/round-NNNNNN under `root`: model.safetensors (θ_true, nanoGPT names),
  // outer.safetensors (momentum, θ_pub), state.json (`state`, completed with the hashes).
  std::string write_checkpoint(const std::string& root, HeadCheckpointState state, int keep);
  // Loads the newest complete checkpoint under `root`: each is verified against its manifest
  // (common::verify_checkpoint), its config hash, and the hashes of θ_pub and the momentum; one
  // that fails is skipped, saying why, for the one before it. Throws common::ConfigError when
  // the config differs, common::IoError when no checkpoint is usable (naming each and why).
  HeadCheckpointState resume(const std::string& root, const std::string& config_hash);

  ~GlobalModel();  // cancels and joins an evaluation still running

 private:
  HeadCheckpointState load_checkpoint(const std::string& dir, const std::string& config_hash);
  // θ_pub ← θ_pub + the update (its fragment): apply_update, or with relay θ_true's values.
  void apply_to_pub(const net::Update& update, const Fragment& part);
  // outer.score (Aggregator::Scorer): the loss on the score batches of θ_true − lr·clip·deq(frame)
  // against θ_true's (measured once a round), on a model of its own: θ_pub's evaluator may be
  // running on its thread meanwhile.
  Aggregator::Score score(const std::string& peer, const net::Frame& frame, float clip);

  common::Config config_;
  inner::Group solo_{inner::DistOptions{}};
  std::unique_ptr<inner::Dataset> data_;
  std::unique_ptr<inner::InnerTrainer> evaluator_;  // its params() are θ_pub
  torch::Tensor theta_true_;
  std::unique_ptr<OuterOptimizer> opt_;
  std::vector<Fragment> fragments_;
  std::unique_ptr<Downlink> downlink_;  // outer.downlink: how a round reaches θ_pub
  Aggregator aggregator_;
  compress::Encoder state_enc_;
  compress::Decoder dec_;
  net::Update last_update_;   // the last update applied to θ_pub
  net::Update pending_;       // an update waiting for an evaluation to end
  uint64_t pub_round_ = 0;
  std::thread eval_thread_;
  std::atomic<bool> eval_done_{false}, eval_cancel_{false};
  std::optional<inner::EvalStats> eval_result_;
  std::exception_ptr eval_error_;
  std::weak_ptr<const void> state_owner_;  // the shared full-state frame, while it is in use
  const uint8_t* state_data_ = nullptr;
  size_t state_size_ = 0;
  std::string pub_hash_, prev_hash_;
  // outer.score: its own group, data (outer.score_batches validation batches) and model.
  std::unique_ptr<inner::Group> score_group_;
  std::unique_ptr<inner::Dataset> score_data_;
  std::unique_ptr<inner::InnerTrainer> scorer_;
  torch::Tensor score_scratch_;
  uint64_t score_round_ = 0;   // the round score_base_ was measured for (0: none)
  double score_base_ = 0;
};

}  // namespace xloco::outer
