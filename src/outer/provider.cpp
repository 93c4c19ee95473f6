#include "outer/provider.h"
#include "outer/attack.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/log_limit.h"
#include "common/metrics.h"
#include "common/process.h"
#include "compress/torch_adapter.h"
#include "inner/data.h"
#include "inner/hf.h"
#include "inner/model.h"
#include "inner/runtime.h"
#include "inner/trainer.h"
#include "net/protocol.h"
#include "outer/leader_rules.h"
#include "outer/link.h"
#include "outer/pace.h"
#include "outer/sync.h"
#include "outer/downlink.h"

namespace xloco::outer {
namespace fs = std::filesystem;

namespace {

// What the leader tells its ranks, over a Gloo broadcast of three int64s: (shard, shards, 0)
// once, then (command, round, fresh AdamW state) per round.
enum Command : int64_t { kStop = 0, kRound = 1 };

std::string hash_of(const torch::Tensor& t) {
  return common::hash_hex(t.data_ptr(), static_cast<size_t>(t.numel()) * 4);
}

// The leader's side of the protocol: joins, follows the head's rounds and updates (the rules
// are leader_rules.h), resynchronises after a head restart, and sends contributions.
class Leader {
 public:
  Leader(const common::Config& cfg, const ProviderOptions& opts, std::unique_ptr<net::Transport> t)
      : cfg_(cfg), opts_(opts), link_(std::move(t), cfg), up_(uplink_codec(cfg.outer)),
        // Parsed before joining: a malformed value is an error before the head admits it.
        attack_(attack_for(std::getenv("XLOCO_ATTACK"), opts.name)) {
    if (attack_) {
      spdlog::warn("provider {}: XLOCO_ATTACK makes it send {} instead of its pseudo-gradient "
                   "(a test device for the attack table)", opts_.name, attack_->text);
    }
  }

  // Sends HELLO with the hash of `theta_pub` (the model this provider built from the run's seed,
  // or loaded from the head's warm-start weights) and waits for WELCOME; returns the shard it
  // was given. The head sends the full state only when that is not its θ_pub (membership.h
  // sync_for): a provider joining a run at its start builds θ₀ itself and downloads nothing,
  // and one joining a round after it gets that round's update (before the WELCOME) instead.
  inner::Shard join(torch::Tensor& theta_pub, const common::FlatLayout& layout) {
    fragments_ = split_fragments(layout, cfg_.outer.fragments);
    state_.rejoining = true;  // waiting for a WELCOME: check_head_alive repeats the HELLO
    hello(hash_of(theta_pub));
    spdlog::info("provider {}: HELLO sent to {}", opts_.name, link_.endpoint());
    bool updated = false;
    while (true) {
      XLOCO_ENFORCE(common::pending_signal() == 0, common::Error, "interrupted while joining");
      if (auto why = link_.fatal()) throw common::ConfigError(*why);
      check_head_alive();
      auto env = link_.next(std::chrono::milliseconds(200));
      if (!env) continue;
      if (auto* u = std::get_if<net::Update>(&env->body)) {
        if (const auto problem = take_update(*u, env->round, theta_pub)) {
          // The WELCOME that follows is judged by the hash the HELLO sent: it brings the state.
          spdlog::warn("provider {}: {}; waiting for the WELCOME", opts_.name, *problem);
          continue;
        }
        updated = true;
        continue;
      }
      if (auto* w = std::get_if<net::Welcome>(&env->body)) {
        if (!w->state.empty()) {
          take_state(w->state, theta_pub, layout);
        } else {
          spdlog::info("provider {}: the model it built from {}{} is the head's: no state to "
                       "download", opts_.name, opts_.init.empty() ? "the run's seed" : opts_.init,
                       updated ? ", with the last round's update," : "");
        }
        state_ = {env->round, false, w->shard_index, w->shard_count};
        return {static_cast<int>(w->shard_index), static_cast<int>(w->shard_count)};
      }
      if (auto* e = std::get_if<net::ErrorReply>(&env->body)) {
        // "Not a member: send HELLO" answers a message that reached the head before this
        // HELLO did (a heartbeat can pass a HELLO still queued): the HELLO is on its way, and
        // check_head_alive repeats it if no WELCOME comes. Any other refusal ends the join.
        if (on_head_message(state_, *env).action == LeaderAction::kRepeatHello) {
          spdlog::info("provider {}: the head had not seen its HELLO yet ({}); waiting for the "
                       "WELCOME", opts_.name, e->reason);
          continue;
        }
        throw common::Error(fmt::format("the head refused provider {}: {} ({})", opts_.name,
                                        e->reason, net::to_string(e->code)));
      }
    }
  }

  // Waits for the head's next instruction, applying updates and resynchronising on the way.
  // Returns the round to run, or 0 to stop.
  uint64_t next_round(torch::Tensor& theta_pub, const common::FlatLayout& layout) {
    while (true) {
      if (auto r = poll(theta_pub, layout, std::chrono::milliseconds(200))) return *r;
    }
  }

  // The head's messages that have come in within `wait` (none left waiting: 0), applied as
  // next_round applies them. The round to run (0: stop) once its ROUND_START is among them.
  std::optional<uint64_t> poll(torch::Tensor& theta_pub, const common::FlatLayout& layout,
                               std::chrono::milliseconds wait) {
    while (true) {
      if (common::pending_signal() != 0) {
        link_.post(net::Bye{"provider interrupted"}, state_.done_round);
        stopped_by_signal_ = true;
        return 0;
      }
      check_head_alive();
      auto env = link_.next(wait);
      if (!env) return std::nullopt;
      const LeaderVerdict v = on_head_message(state_, *env);
      switch (v.action) {
        case LeaderAction::kRunRound: return env->round;
        case LeaderAction::kApplyUpdate:
          if (const auto problem = take_update(std::get<net::Update>(env->body), env->round, theta_pub)) {
            resync(theta_pub, *problem);  // the head sends what it lacks
            break;
          }
          state_.done_round = env->round;
          break;
        case LeaderAction::kResync: resync(theta_pub, v.reason); break;
        case LeaderAction::kRejoined: rejoined(*env, theta_pub, layout, v.reason); break;
        case LeaderAction::kRepeatHello: repeat_hello(5.0); break;
        case LeaderAction::kStop: spdlog::info("provider {}: {}", opts_.name, v.reason); return 0;
        case LeaderAction::kFatal: throw common::Error(fmt::format("provider {}: {}", opts_.name, v.reason));
        case LeaderAction::kReport: spdlog::warn("provider {}: {}", opts_.name, v.reason); break;
        case LeaderAction::kIgnore: break;
      }
    }
  }

  // Sends δ (flat, CPU) for round r, its fragment's tensors only (outer.fragments); the
  // encoder keeps what it could not send as its residual.
  void contribute(uint64_t r, const torch::Tensor& delta, uint64_t tokens, double compute_s,
                  double train_loss) {
    torch::NoGradGuard guard;
    std::vector<uint8_t> frame;
    if (attack_) {
      compress::encode(up_, fragment(r).layout, apply_attack(*attack_, r, delta), frame);
    } else {
      compress::encode(up_, fragment(r).layout, delta, frame);
    }
    bytes_up_ += static_cast<double>(frame.size());
    tokens_ += tokens;  // reported in the next HELLO
    contributed_ = r;
    net::Contribution c;
    c.tokens = tokens;
    c.compute_s = compute_s;
    c.train_loss = train_loss;
    c.payload = net::Frame(std::move(frame));
    downlink_->sent(r, c.payload);  // relay sends each provider the others' frames only
    link_.post(c, r);
  }

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
  void hello(const std::string& hash) {
    link_.post(net::Hello{opts_.name, common::config_hash(cfg_), tokens_, hash, opts_.shard},
               state_.done_round);
    last_hello_ = Clock::now();
    last_hash_ = hash;
  }

  // The head restarted, declared this provider dead, or it missed updates: HELLO again with
  // the hash of the θ_pub it holds; the head answers with what it lacks (design §2). The
  // provider's ranks keep running; they wait in the next control broadcast.
  void resync(const torch::Tensor& theta_pub, const std::string& why) {
    spdlog::warn("provider {}: rejoining the head ({})", opts_.name, why);
    state_.rejoining = true;
    hello(hash_of(theta_pub));
  }

  // θ_pub from the head: round r's update applied to it (its fragment's tensors), or a full
  // state in its place; both counted. Without what the update needs (a relayed update's own
  // frame), or when the result is not finite (which the head would not have sent), θ_pub is
  // left as it was and the reason returned (downlink.h).
  std::optional<std::string> take_update(const net::Update& u, uint64_t r, torch::Tensor& theta_pub) {
    bytes_down_ += static_cast<double>(u.bytes());
    return downlink_->take(u, r, opts_.name, theta_pub, fragment(r).layout);
  }
  void take_state(const net::Frame& state, torch::Tensor& theta_pub, const common::FlatLayout& layout) {
    compress::decode(dec_, state.data(), state.size(), layout, theta_pub);
    bytes_down_ += static_cast<double>(state.size());
  }

  void rejoined(const net::Envelope& env, torch::Tensor& theta_pub,
                const common::FlatLayout& layout, const std::string& why) {
    const auto& w = std::get<net::Welcome>(env.body);
    if (!w.state.empty()) {
      take_state(w.state, theta_pub, layout);
      // Design §2 starts a fresh AdamW state on a full state; the inner state it holds is kept
      // when it continues the run by the rule a restarted provider's saved state follows (a
      // head that went back a round or two to its checkpoint), so that a head restart does not
      // cost every provider a new warm-up.
      const std::string run_config = common::config_hash(cfg_);
      const auto keep = judge_saved_state({contributed_, "", run_config}, env.round,
                                          hash_of(theta_pub), run_config);
      fresh_state_ = !keep.resume;
      spdlog::info("provider {}: {} ({})", opts_.name,
                   keep.resume ? "keeps its AdamW state and residual" : "starts a fresh AdamW state",
                   keep.reason);
    }
    state_.done_round = env.round;
    state_.rejoining = false;
    spdlog::info("provider {}: {}", opts_.name, why);
  }

  void check_head_alive() {
    const double silent = link_.head_silent_s();
    XLOCO_ENFORCE(silent < cfg_.outer.head_timeout_s, common::Error,
                  "provider {}: the head at {} has been silent for {:.0f}s "
                  "(outer.head_timeout_s); giving up",
                  opts_.name, link_.endpoint(), silent);
    if (silent > 3 * cfg_.outer.heartbeat_s + 1 && !head_quiet_) {
      head_quiet_ = true;
      spdlog::warn("provider {}: no word from the head for {:.0f}s; waiting (the link reconnects "
                   "by itself)", opts_.name, silent);
    } else if (silent < cfg_.outer.heartbeat_s) {
      head_quiet_ = false;
    }
    // A HELLO may have gone to a head that died before answering, or been ignored as a
    // repeat (membership.h admit): ask again now and then until a WELCOME comes.
    if (state_.rejoining) repeat_hello(std::max(10.0, cfg_.outer.dead_after_s));
  }

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

// One provider's ranks: the leader talks to the head, every rank trains, and the leader's
// decisions reach the others through Gloo broadcasts.
class ProviderRun {
 public:
  ProviderRun(const common::Config& cfg, const ProviderOptions& opts, inner::Group& group,
              std::unique_ptr<net::Transport> transport)
      : cfg_(cfg), opts_(opts), group_(group), leader_(group.leader()),
        // Parsed before joining: a malformed value is an error before the head admits it.
        throttle_(throttle_factor(std::getenv("XLOCO_THROTTLE"), opts.name)) {
    // The model first, from the run's seed (or the warm-start weights) as the head builds
    // it: joining at the run's start it is θ_pub already, and the head need not send it.
    trainer_ = std::make_unique<inner::InnerTrainer>(cfg, inner::make_model(cfg), group,
                                                     inner::resolve_device(cfg.run.device));
    if (!opts.init.empty()) {
      trainer_->load_model(inner::load_init_weights(opts.init));
      if (leader_) spdlog::info("provider {}: θ from {} (the head's warm start)", opts.name, opts.init);
    }
    theta_pub_ = torch::empty({trainer_->layout().numel}, torch::kFloat32);
    if (leader_) {
      lead_ = std::make_unique<Leader>(cfg, opts, std::move(transport));
      {
        torch::NoGradGuard guard;
        theta_pub_.copy_(trainer_->params());
      }
      const auto s = lead_->join(theta_pub_, trainer_->layout());
      ctrl_[0] = s.index;
      ctrl_[1] = s.count;
    }
    group_.broadcast(ctrl_);
    shard_ = {static_cast<int>(ctrl_[0].item<int64_t>()), static_cast<int>(ctrl_[1].item<int64_t>())};
    data_ = inner::make_dataset(cfg, shard_);
    trainer_->set_rng_stream(static_cast<uint64_t>(shard_.index));
    if (leader_) {
      spdlog::info("provider {}: joined as shard {}/{} | {}", opts.name, shard_.index, shard_.count,
                   data_->describe());
      metrics_.open((fs::path(opts.run_dir) / "metrics" / ("provider-" + opts.name + ".jsonl")).string());
    }
    resume_saved_state();
    if (leader_ && throttle_ > 1) {
      spdlog::warn("provider {}: XLOCO_THROTTLE makes it {:g}x slower (a test device: it sleeps "
                   "after each step)", opts.name, throttle_);
    }
    if (leader_ && delayed_) {
      spdlog::info("provider {}: outer.overlap = delayed: it trains the next round while the "
                   "last one's update is on its way", opts.name);
    }
  }

  // The round the leader says to run, on every rank; 0 to stop.
  uint64_t next_round() {
    ctrl_.zero_();
    if (leader_) {
      // A ROUND_START that update_arrived() already took is this call's answer.
      const uint64_t r = pending_round_ ? *std::exchange(pending_round_, std::nullopt)
                                        : lead_->next_round(theta_pub_, trainer_->layout());
      ctrl_[0] = r == 0 ? kStop : kRound;
      ctrl_[1] = static_cast<int64_t>(r);
      ctrl_[2] = lead_->take_fresh_state() ? 1 : 0;
    }
    group_.broadcast(ctrl_);
    if (ctrl_[0].item<int64_t>() == kStop) return 0;
    if (ctrl_[2].item<int64_t>() != 0) {
      own_round_ = 0;  // its own parameters belong to another θ_pub now
      sent_round_ = 0;
      wait_for_save();  // it borrows the moments being replaced
      trainer_->reset_optimizer();  // resynchronised with full state: a fresh AdamW state
      if (leader_) spdlog::info("provider {}: fresh AdamW state after a full-state resync", opts_.name);
    }
    return static_cast<uint64_t>(ctrl_[1].item<int64_t>());
  }

  // How a round's inner steps ended.
  struct RoundEnd {
    enum What { kTrained, kInterrupted, kStop, kRedirect } what = kTrained;
    uint64_t round = 0;  // kRedirect: the round the head is at instead
  };

  // Round r's inner steps (next_step: H, or the time budget), on every rank: from θ_pub, or,
  // `chained` (outer.overlap = delayed), from where the last round left the parameters, with
  // round r − 1's update folded in after outer.delay_steps of them (fold_update).
  RoundEnd train_round(uint64_t r, bool chained) {
    // The moments and residual are about to move: wait for a save that borrows them. A delayed
    // provider's save works on copies (save_state), so its next round never waits for the disk.
    const double state_wait_s = delayed_ ? 0.0 : wait_for_save();
    {
      torch::NoGradGuard guard;
      if (leader_ && !chained) {
        if (sent_round_ != 0 && sent_round_ + 1 == r) {
          // outer.fragments: only the tensors round r − 1 synced take the new θ_pub (with
          // keep_local's share of their own); the others keep their progress since their sync.
          const Fragment& f = lead_->fragment(r - 1);
          torch::Tensor p = trainer_->params().narrow(0, f.begin, f.numel());
          const torch::Tensor pub = theta_pub_.narrow(0, f.begin, f.numel());
          if (keep_local_ > 0) {
            torch::Tensor own = p.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
            own.sub_(pub).mul_(keep_local_).add_(pub);
            p.copy_(own);
          } else {
            p.copy_(pub);
          }
        } else if (own_round_ != 0 && own_round_ + 1 == r) {
          // outer.keep_local: from θ_pub + a · (θ_own − θ_pub), θ_own where round r − 1 ended.
          own_.sub_(theta_pub_).mul_(keep_local_).add_(theta_pub_);
          trainer_->params().copy_(own_);
        } else {
          trainer_->params().copy_(theta_pub_);
        }
        own_round_ = 0;
        sent_round_ = 0;
      }
      group_.broadcast(trainer_->params());
      if (leader_ && delayed_) {
        // The base its progress is measured from: θ_pub, or the chained start until the fold.
        // With outer.fragments only the tensors round r − 1 sent start again; the others'
        // progress is still measured from the θ_pub of their last fold.
        if (!base_.defined()) base_ = torch::empty({trainer_->layout().numel}, torch::kFloat32);
        if (chained && lead_->fragment(r - 1).numel() != base_.numel()) {
          const Fragment& f = lead_->fragment(r - 1);
          base_.narrow(0, f.begin, f.numel()).copy_(trainer_->params().narrow(0, f.begin, f.numel()));
        } else {
          base_.copy_(trainer_->params());
        }
      }
    }
    chained_ = chained;
    if (!chained) carry_s_ = 0;  // a round after a wait starts on the others' clock
    const auto start = Clock::now();
    idle_s_ = std::chrono::duration<double>(start - compute_end_).count();
    state_wait_s_ = state_wait_s;
    tokens_ = 0;
    loss_sum_ = 0;
    loss_steps_ = 0;
    double waited_s = 0;  // for the update, at the fold: idle, not compute
    bool folded = !chained;
    folded_at_ = -1;
    const int64_t first = static_cast<int64_t>(r - 1) * cfg_.outer.inner_steps;
    int64_t done = 0;
    double step_s = 0;  // the last step's wall time (a fold's wait excluded)
    for (;;) {
      // Every rank must take the same decision: with a time budget the leader's clock decides,
      // and more_steps broadcasts its verdict (a broadcast per step only when budgeted).
      double elapsed = std::chrono::duration<double>(Clock::now() - start).count() - waited_s;
      if (!more_steps(r, done, elapsed, step_s)) break;
      if (!folded && fold_now(done, arrival_ && update_arrived(), cfg_).fold) {
        const auto end = fold_update(r, waited_s);
        if (end.what != RoundEnd::kTrained) return end;
        folded = true;
        folded_at_ = done;
      }
      const int64_t step = first + done;
      const auto t_step = Clock::now();
      const auto st = trainer_->train_step(*data_, step, common::pending_signal() != 0,
                                           schedule_position(r, done, elapsed, cfg_));
      ++done;
      tokens_ += static_cast<uint64_t>(st.tokens);
      if (std::isfinite(st.loss)) {
        loss_sum_ += st.loss;
        ++loss_steps_;
      }
      if (throttle_ > 1) {
        const auto took = Clock::now() - t_step;
        std::this_thread::sleep_for(std::chrono::duration_cast<std::chrono::microseconds>(took * (throttle_ - 1)));
      }
      step_s = std::chrono::duration<double>(Clock::now() - t_step).count();
      if (done % cfg_.inner.log_every == 0) log_step(r, step, st, tokens_, start);
      if (st.stop) {
        if (leader_) {
          spdlog::warn("provider {}: interrupted in round {}", opts_.name, r);
          lead_->goodbye("provider interrupted");
        }
        return {RoundEnd::kInterrupted};
      }
      last_stats_ = st;
      last_step_ = step;
    }
    // A round that ended before its fold step (a short last round, a spent budget) folds now.
    if (!folded) {
      const auto end = fold_update(r, waited_s);
      if (end.what != RoundEnd::kTrained) return end;
      folded_at_ = done;
    }
    if (done % cfg_.inner.log_every != 0) log_step(r, last_step_, last_stats_, tokens_, start);
    steps_done_ = done;
    compute_s_ = std::chrono::duration<double>(Clock::now() - start).count() - waited_s;
    carry_s_ = budget_carry(carry_s_, compute_s_, cfg_);
    idle_s_ += waited_s;
    compute_end_ = Clock::now();
    return {};
  }

  // The leader's contribution for round r, δ = base − θ (base: θ_pub, or with overlap the
  // θ_pub its last fold brought in), its saved state and metrics.
  void finish_round(uint64_t r) {
    if (!leader_) return;
    torch::NoGradGuard guard;
    const double up0 = lead_->bytes_up(), down0 = lead_->bytes_down();
    torch::Tensor& theta = trainer_->params();
    torch::Tensor delta;
    const Fragment& f = lead_->fragment(r);
    if (f.numel() != theta.numel()) {
      // outer.fragments: δ of this round's tensors only, in a buffer of its own; θ (and the
      // base, with overlap) lives on, since the other fragments' progress is not sent yet.
      if (!delta_.defined()) delta_ = torch::empty({theta.numel()}, torch::kFloat32);
      delta = delta_;
      auto d = delta.narrow(0, f.begin, f.numel());
      const torch::Tensor from = delayed_ ? base_ : theta_pub_;
      torch::sub_out(d, from.narrow(0, f.begin, f.numel()),
                     theta.narrow(0, f.begin, f.numel()).to(torch::kCPU));
      if (!delayed_) sent_round_ = r;
    } else if (delayed_) {
      // δ in the base's memory: θ lives on as the next round's start.
      delta = base_;
      torch::sub_out(delta, base_, theta.is_cpu() ? theta : theta.to(torch::kCPU));
    } else {
      if (keep_local_ > 0) {
        // outer.keep_local: where this round ended, for the next round's start.
        if (!own_.defined()) own_ = torch::empty({trainer_->layout().numel}, torch::kFloat32);
        own_.copy_(theta);
        own_round_ = r;
      }
      // δ = θ_pub − θ in θ's own memory (on a GPU, in its host copy): θ is spent now, and the
      // next round starts by overwriting it with θ_pub.
      delta = theta.is_cpu() ? theta : theta.to(torch::kCPU);
      torch::sub_out(delta, theta_pub_, delta);
    }
    lead_->contribute(r, delta, tokens_, compute_s_,
                      loss_steps_ > 0 ? loss_sum_ / static_cast<double>(loss_steps_) : -1.0);
    const std::string base_hash = hash_of(theta_pub_);  // θ_pub(r − 1), before the update
    // While the contribution goes out and the head closes the round: keep what a restart
    // would otherwise lose, on a thread of its own (joined before the next round trains).
    save_state(r, base_hash);
    // Per round: its compute, and the time it spent not computing before it (sending,
    // waiting for the round to close, receiving the update), with the bytes behind them.
    metrics_.write({{"round_done", r}, {"compute_s", compute_s_}, {"idle_s", idle_s_},
                    {"steps", steps_done_}, {"tokens", tokens_}, {"chained", chained_},
                    {"folded_at", folded_at_}, {"budget_carry_s", carry_s_},
                    {"up_bytes", lead_->bytes_up() - up0}, {"down_bytes", down0 - down_at_end_},
                    {"state_save_s", last_save_s_.load()}, {"state_wait_s", state_wait_s_}});
    down_at_end_ = down0;
  }

  // A chained round that the head did not confirm (it restarted, or this provider was
  // resynchronised): its steps are dropped, and the round the head is at starts from θ_pub.
  // The AdamW moments keep what those steps added (as they keep what any round adds when the
  // head goes back to an older checkpoint: leader_rules.h judge_saved_state).
  void discard(uint64_t r, uint64_t instead) {
    if (leader_) {
      spdlog::warn("provider {}: drops its steps of round {}, which it trained ahead of the head "
                   "(the head is at round {} now)", opts_.name, r, instead);
    }
  }

 private:
  // The fold of a chained round r (design §2, outer.overlap = delayed): wait for the head's
  // ROUND_START of r, which follows round r − 1's update, then move the progress made so far
  // onto the new θ_pub: θ ← θ_pub(r − 1) + (θ − base), base ← θ_pub(r − 1) (the eager
  // updates of arXiv 2502.12996; Streaming DiLoCo's merge). With outer.keep_local = a the
  // start it moves onto keeps a share of the provider's own: θ_pub(r − 1) + a · (base −
  // θ_pub(r − 1)), base being where round r − 1 ended. Every rank takes θ. A head that
  // went elsewhere (a restart, a resync) redirects the provider to the round it is at.
  RoundEnd fold_update(uint64_t r, double& waited_s) {
    const auto t0 = Clock::now();
    const uint64_t confirmed = next_round();
    waited_s += std::chrono::duration<double>(Clock::now() - t0).count();
    if (confirmed == 0) return {RoundEnd::kStop};
    if (confirmed != r) return {RoundEnd::kRedirect, confirmed};
    torch::NoGradGuard guard;
    torch::Tensor& theta = trainer_->params();
    if (leader_) {
      // In place (on a GPU, in its host copy): no model-sized temporaries. With
      // outer.fragments only the tensors round r − 1 synced move: θ_pub changed there alone.
      const Fragment& f = lead_->fragment(r - 1);
      torch::Tensor part = theta.narrow(0, f.begin, f.numel());
      torch::Tensor host = part.is_cpu() ? part : part.to(torch::kCPU);
      const torch::Tensor base = base_.narrow(0, f.begin, f.numel());
      const torch::Tensor pub = theta_pub_.narrow(0, f.begin, f.numel());
      host.sub_(base).add_(pub);
      if (keep_local_ > 0) host.add_(base, keep_local_).sub_(pub, keep_local_);
      if (!part.is_cpu()) part.copy_(host);
      base_.narrow(0, f.begin, f.numel()).copy_(pub);
    }
    group_.broadcast(theta);
    return {};
  }

  // Whether round r − 1's update (and the head's ROUND_START after it) has come in, without
  // waiting for it; the leader's answer on every rank (a broadcast per step when world > 1).
  bool update_arrived() {
    bool arrived = false;
    if (leader_) {
      if (!pending_round_) pending_round_ = lead_->poll(theta_pub_, trainer_->layout(), std::chrono::milliseconds(0));
      arrived = pending_round_.has_value();
    }
    if (group_.world() > 1) {
      torch::Tensor v = torch::tensor({arrived ? int64_t{1} : int64_t{0}}, torch::kInt64);
      group_.broadcast(v);
      arrived = v[0].item<int64_t>() != 0;
    }
    return arrived;
  }

  // next_step's verdict, the same on every rank: without a time budget it depends on the step
  // count alone; with one, the leader's clock decides and a broadcast carries its verdict and
  // its `elapsed` (which the schedule position also reads).
  bool more_steps(uint64_t r, int64_t done, double& elapsed, double step_s) {
    if (cfg_.outer.round_budget_s <= 0) return next_step(r, done, elapsed, cfg_).more;
    bool more = next_step(r, done, elapsed, cfg_, step_s, carry_s_).more;
    if (group_.world() > 1) {
      torch::Tensor v = torch::tensor({more ? 1.0 : 0.0, elapsed}, torch::kFloat64);
      group_.broadcast(v);
      more = v[0].item<double>() != 0;
      elapsed = v[1].item<double>();
    }
    return more;
  }

 public:
  ~ProviderRun() { wait_for_save(); }

  int finish(const Clock::time_point t0) {
    wait_for_save();
    if (!leader_) return 0;
    const auto hash = hash_of(theta_pub_);
    spdlog::info("provider {}: finished after {} | {} sent | theta_pub {} | peak RSS {}", opts_.name,
                 common::human_duration(std::chrono::duration<double>(Clock::now() - t0).count()),
                 common::human_bytes(lead_->bytes_up()), hash,
                 common::human_bytes(static_cast<double>(common::peak_rss_bytes())));
    metrics_.write({{"final", true}, {"theta_pub_hash", hash}, {"bytes_up", lead_->bytes_up()},
                    {"peak_rss_bytes", common::peak_rss_bytes()},
                    {"param_bytes", theta_pub_.numel() * 4}});
    return lead_->stopped_by_signal() ? 130 : 0;
  }

 private:
  fs::path state_root() const { return fs::path(opts_.run_dir) / "state"; }

  // The provider's own durable state (leader_rules.h SavedProviderState): its AdamW moments
  // and uplink residual right after round r's contribution, atomically in
  // RUN/providers/NAME/state/round-R (common/checkpoint.h: manifest, fsync, rename; the newest
  // one kept). A failed write (a full disk) is reported and retried next round, never fatal:
  // the worst a restart then loses is what it would have lost without it.
  void save_state(uint64_t r, const std::string& base_hash) {
    if (!save_state_) return;
    wait_for_save();
    auto contents = std::make_shared<common::CheckpointContents>();
    auto& c = *contents;
    c.files["optim.safetensors"] = trainer_->optimizer_blobs();
    std::vector<common::TensorBlob> residuals;
    for (const auto& s : trainer_->layout().slots) {
      if (const auto* e = lead_->uplink().residual(s.name)) {
        common::TensorBlob b;
        b.name = s.name;
        b.dtype = "F32";
        b.shape = {static_cast<int64_t>(e->size())};
        b.borrowed = reinterpret_cast<const uint8_t*>(e->data());
        b.borrowed_size = e->size() * sizeof(float);
        residuals.push_back(std::move(b));
      }
    }
    if (!residuals.empty()) c.files["residual.safetensors"] = std::move(residuals);
    c.state = {{"round", r},
               {"base_hash", base_hash},
               {"config_hash", common::config_hash(cfg_)},
               {"provider", opts_.name},
               {"shard", shard_.index},
               {"adam_steps", trainer_->adam_steps()}};
    // The blobs borrow the moments and the residuals: nothing touches them until the next
    // round trains (train_round), a fresh AdamW state replaces them (next_round) or the run
    // ends, and each of those joins this first. A delayed provider trains the next round at
    // once, so it saves a copy (3 × the parameters in host memory while the write runs)
    // rather than wait for the disk.
    if (delayed_) {
      for (auto& [file, blobs] : c.files) {
        for (auto& b : blobs) {
          if (b.borrowed == nullptr) continue;
          b.data.assign(b.borrowed, b.borrowed + b.borrowed_size);
          b.borrowed = nullptr;
          b.borrowed_size = 0;
        }
      }
    }
    saving_ = std::async(std::launch::async, [this, contents, r] {
      const auto start = Clock::now();
      try {
        common::write_checkpoint(state_root().string(), fmt::format("round-{:06d}", r), *contents, 1);
        if (save_failures_ > 0) {
          spdlog::info("provider {}: saved its state again after {} failed writes", opts_.name, save_failures_);
          save_failures_ = 0;
        }
      } catch (const std::exception& e) {
        ++save_failures_;
        const auto v = save_log_.check("save");
        if (v.log) {
          spdlog::warn("provider {}: could not save its state after round {} (a restart would "
                       "start a fresh AdamW state and residual): {}{}", opts_.name, r, e.what(),
                       common::LogLimiter::note(v));
        }
      }
      last_save_s_ = std::chrono::duration<double>(Clock::now() - start).count();
    });
  }

  // Joins a save in flight; the seconds it waited.
  double wait_for_save() {
    if (!saving_.valid()) return 0;
    const auto start = Clock::now();
    saving_.get();
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

  // At the join: the leader judges its newest saved state against the θ_pub the head just
  // sent (judge_saved_state) and loads it or says why not; every rank takes the moments.
  void resume_saved_state() {
    torch::Tensor resumed = torch::zeros({1}, torch::kInt64);
    if (leader_) resumed[0] = load_saved_state() ? 1 : 0;
    group_.broadcast(resumed);
    if (resumed.item<int64_t>() != 0) trainer_->broadcast_optimizer();
  }

  bool load_saved_state() {
    const std::string root = state_root().string();
    try {
      for (const auto& name : common::remove_stale_temp(root)) {
        spdlog::info("provider {}: removed {} left by an interrupted save", opts_.name, name);
      }
      common::check_writable(root);
    } catch (const std::exception& e) {
      save_state_ = false;
      spdlog::warn("provider {}: its state directory is not writable, so a restart will lose its "
                   "AdamW state and residual: {}", opts_.name, e.what());
      return false;
    }
    std::vector<std::string> skipped;
    const auto dir = common::latest_checkpoint(root, &skipped);
    for (const auto& why : skipped) spdlog::warn("provider {}: saved state skipped: {}", opts_.name, why);
    if (!dir) return false;
    try {
      const auto st = common::read_checkpoint_state(*dir);
      const SavedProviderState saved{st.at("round").get<uint64_t>(), st.at("base_hash").get<std::string>(),
                                     st.at("config_hash").get<std::string>()};
      const auto v = judge_saved_state(saved, lead_->done_round(), hash_of(theta_pub_),
                                       common::config_hash(cfg_));
      if (!v.resume) {
        spdlog::warn("provider {}: saved state {} discarded: {}", opts_.name, *dir, v.reason);
        return false;
      }
      trainer_->load_optimizer(common::read_safetensors(*dir + "/optim.safetensors"));
      size_t restored = 0;
      if (fs::exists(*dir + "/residual.safetensors")) {
        const auto file = common::read_safetensors(*dir + "/residual.safetensors");
        for (const auto& blob : file.tensors) {
          const auto& slots = trainer_->layout().slots;
          const auto it = std::find_if(slots.begin(), slots.end(),
                                       [&](const common::ParamSlot& s) { return s.name == blob.name; });
          const common::ParamSlot* slot = it == slots.end() ? nullptr : &*it;
          XLOCO_ENFORCE(slot != nullptr && blob.dtype == "F32" &&
                            blob.data.size() == static_cast<size_t>(slot->numel) * sizeof(float),
                        common::IoError, "{}/residual.safetensors: tensor {} is not one of the model's",
                        *dir, blob.name);
          std::vector<float> values(static_cast<size_t>(slot->numel));
          std::memcpy(values.data(), blob.data.data(), blob.data.size());
          lead_->uplink().set_residual(blob.name, std::move(values));
          ++restored;
        }
      }
      lead_->set_contributed(saved.round);
      spdlog::info("provider {}: resumed its AdamW state (step {}) and {} error-feedback residuals "
                   "from {}: {}", opts_.name, trainer_->adam_steps(), restored, *dir, v.reason);
      return true;
    } catch (const std::exception& e) {
      trainer_->reset_optimizer();
      lead_->uplink().reset_residuals();
      spdlog::warn("provider {}: saved state {} discarded: {}", opts_.name, *dir, e.what());
      return false;
    }
  }

  void log_step(uint64_t r, int64_t step, const inner::StepStats& st, uint64_t tokens,
                Clock::time_point start) {
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    const double rate = static_cast<double>(tokens) / std::max(secs, 1e-9);
    spdlog::info("{} | round {} | step {}/{} | loss {:.4f} | lr {:.2e} | {} tok/s", opts_.name, r,
                 step + 1, cfg_.inner.steps, st.loss, st.lr, common::human_rate(rate));
    metrics_.write({{"round", r}, {"step", step + 1}, {"loss", st.loss}, {"lr", st.lr},
                    {"tokens_per_s", rate}});
    if (leader_) lead_->progress(r, static_cast<uint64_t>(step + 1), rate);
  }

  const common::Config& cfg_;
  const ProviderOptions& opts_;
  inner::Group& group_;
  const bool leader_;
  const double throttle_;  // XLOCO_THROTTLE's factor for this provider (a test device)
  std::unique_ptr<Leader> lead_;
  torch::Tensor ctrl_ = torch::zeros({3}, torch::kInt64);
  inner::Shard shard_;
  std::unique_ptr<inner::Dataset> data_;
  std::unique_ptr<inner::InnerTrainer> trainer_;
  torch::Tensor theta_pub_;
  common::JsonlWriter metrics_;
  bool save_state_ = true;
  const bool delayed_ = cfg_.outer.overlap == common::Overlap::kDelayed;
  const bool arrival_ = cfg_.outer.fold == common::Fold::kArrival;  // polls for the update at each step
  torch::Tensor base_;  // the leader's: what a delayed round's progress is measured from
  const double keep_local_ = cfg_.outer.keep_local;
  // The leader's, synchronous with keep_local > 0: where round own_round_ ended (0: none).
  torch::Tensor own_;
  uint64_t own_round_ = 0;
  // The leader's, synchronous with outer.fragments > 1: the round whose fragment it sent last
  // (0: none), and δ's buffer (θ keeps the other fragments' progress).
  uint64_t sent_round_ = 0;
  torch::Tensor delta_;
  uint64_t tokens_ = 0;
  int64_t steps_done_ = 0, last_step_ = 0;
  inner::StepStats last_stats_;
  double compute_s_ = 0, idle_s_ = 0, state_wait_s_ = 0;
  double loss_sum_ = 0;     // this round's training losses, for its contribution's train_loss
  int64_t loss_steps_ = 0;
  bool chained_ = false;  // the round in hand started before the head confirmed it
  double carry_s_ = 0;     // with a time budget: what chained rounds ran over it (budget_carry)
  int64_t folded_at_ = -1;  // the step its fold came at (-1: not chained)
  std::optional<uint64_t> pending_round_;  // the leader's: a ROUND_START polled before its fold
  std::future<void> saving_;
  std::atomic<double> last_save_s_{0};  // the last save's own time (written by its thread)
  uint64_t save_failures_ = 0;
  common::LogLimiter save_log_;
  Clock::time_point compute_end_ = Clock::now();  // of the last round (or the join)
  double down_at_end_ = 0;                         // bytes received by then
};

}  // namespace

int run_provider(const common::Config& cfg, const ProviderOptions& opts, inner::Group& group,
                 std::unique_ptr<net::Transport> transport) {
  common::install_forwarding_handlers();
  const auto t0 = Clock::now();
  ProviderRun run(cfg, opts, group, std::move(transport));
  // With outer.overlap = delayed, a round after the first runs `chained`, before the head has
  // started it; the head's ROUND_START (after the last round's update) confirms it at its fold.
  uint64_t r = run.next_round();
  bool chained = false;
  while (r != 0) {
    const auto end = run.train_round(r, chained);
    if (end.what == ProviderRun::RoundEnd::kInterrupted) return 130;
    if (end.what == ProviderRun::RoundEnd::kStop) break;
    if (end.what == ProviderRun::RoundEnd::kRedirect) {
      run.discard(r, end.round);
      r = end.round;
      chained = false;
      continue;
    }
    run.finish_round(r);
    chained = chains_next_round(r, cfg);
    r = chained ? r + 1 : run.next_round();
  }
  return run.finish(t0);
}

}  // namespace xloco::outer
