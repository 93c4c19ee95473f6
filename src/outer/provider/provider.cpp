#include "outer/provider/provider.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <thread>
#include <utility>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "common/error.h"
#include "common/metrics.h"
#include "common/process.h"
#include "inner/data.h"
#include "inner/hf.h"
#include "inner/model.h"
#include "inner/runtime.h"
#include "inner/trainer.h"
#include "outer/provider/provider_leader.h"
#include "outer/provider/provider_round.h"
#include "outer/provider/provider_state.h"
#include "outer/round/pace.h"
#include "outer/round/sync.h"

namespace xloco::outer {
namespace fs = std::filesystem;

namespace {

// What the leader tells its ranks, over a Gloo broadcast of three int64s: (shard, shards, 0)
// once, then (command, round, fresh AdamW state) per round.
enum Command : int64_t { kStop = 0, kRound = 1 };

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
                                                     group.device());
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
      round_base_.forget();  // its own parameters belong to another θ_pub now
      store_.wait();  // it borrows the moments being replaced
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
    const auto start = begin_round(r, chained);
    double waited_s = 0;  // for the update, at the fold: idle, not compute
    bool folded = !chained;
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
      if (!inner_step(r, done, elapsed, start, step_s)) return {RoundEnd::kInterrupted};
    }
    // A round that ended before its fold step (a short last round, a spent budget) folds now.
    if (!folded) {
      const auto end = fold_update(r, waited_s);
      if (end.what != RoundEnd::kTrained) return end;
      folded_at_ = done;
    }
    end_round(r, done, start, waited_s);
    return {};
  }

  // The leader's contribution for round r, δ = base − θ (base: θ_pub, or with overlap the
  // θ_pub its last fold brought in), its saved state and metrics.
  void finish_round(uint64_t r) {
    if (!leader_) return;
    torch::NoGradGuard guard;
    const double up0 = lead_->bytes_up(), down0 = lead_->bytes_down();
    const torch::Tensor delta = round_base_.delta(r, trainer_->params(), theta_pub_, *lead_);
    lead_->contribute(r, delta, tokens_, compute_s_,
                      loss_steps_ > 0 ? loss_sum_ / static_cast<double>(loss_steps_) : -1.0);
    const std::string base_hash = flat_hash(theta_pub_);  // θ_pub(r − 1), before the update
    // While the contribution goes out and the head closes the round: keep what a restart
    // would otherwise lose, on a thread of its own (joined before the next round trains).
    store_.save(r, base_hash, *trainer_, lead_->uplink(), shard_.index, delayed_);
    // Per round: its compute, and the time it spent not computing before it (sending,
    // waiting for the round to close, receiving the update), with the bytes behind them.
    metrics_.write({{"round_done", r}, {"compute_s", compute_s_}, {"idle_s", idle_s_},
                    {"steps", steps_done_}, {"tokens", tokens_}, {"chained", chained_},
                    {"folded_at", folded_at_}, {"budget_carry_s", carry_s_},
                    {"up_bytes", lead_->bytes_up() - up0}, {"down_bytes", down0 - down_at_end_},
                    {"state_save_s", store_.last_save_s()}, {"state_wait_s", state_wait_s_}});
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
  // Round r's start on every rank (RoundBase::begin on the leader, then θ broadcast) and its
  // counters reset; the time its steps start from.
  Clock::time_point begin_round(uint64_t r, bool chained) {
    // The moments and residual are about to move: wait for a save that borrows them. A delayed
    // provider's save works on copies (SavedStateStore), so its next round never waits for the disk.
    const double state_wait_s = delayed_ ? 0.0 : store_.wait();
    if (leader_ && !chained) round_base_.begin(r, trainer_->params(), theta_pub_, *lead_);
    {
      torch::NoGradGuard guard;
      group_.broadcast(trainer_->params());
    }
    if (leader_) round_base_.set_base(r, chained, trainer_->params(), *lead_);
    chained_ = chained;
    if (!chained) carry_s_ = 0;  // a round after a wait starts on the others' clock
    const auto start = Clock::now();
    idle_s_ = std::chrono::duration<double>(start - compute_end_).count();
    state_wait_s_ = state_wait_s;
    tokens_ = 0;
    loss_sum_ = 0;
    loss_steps_ = 0;
    folded_at_ = -1;
    return start;
  }

  // Inner step `done` of round r (then done + 1); false when a signal stopped it.
  bool inner_step(uint64_t r, int64_t& done, double elapsed, Clock::time_point start,
                  double& step_s) {
    const int64_t step = static_cast<int64_t>(r - 1) * cfg_.outer.inner_steps + done;
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
      return false;
    }
    last_stats_ = st;
    last_step_ = step;
    return true;
  }

  // Round r's `done` steps are over: its compute time (the fold's wait excluded) and budget carry.
  void end_round(uint64_t r, int64_t done, Clock::time_point start, double waited_s) {
    if (done % cfg_.inner.log_every != 0) log_step(r, last_step_, last_stats_, tokens_, start);
    steps_done_ = done;
    compute_s_ = std::chrono::duration<double>(Clock::now() - start).count() - waited_s;
    carry_s_ = budget_carry(carry_s_, compute_s_, cfg_);
    idle_s_ += waited_s;
    compute_end_ = Clock::now();
  }

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
    if (leader_) round_base_.fold(r, theta, theta_pub_, *lead_);
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
  ~ProviderRun() { store_.wait(); }

  int finish(const Clock::time_point t0) {
    store_.wait();
    if (!leader_) return 0;
    const auto hash = flat_hash(theta_pub_);
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
  // At the join: the leader judges its newest saved state against the θ_pub the head just
  // sent (judge_saved_state) and loads it or says why not; every rank takes the moments.
  void resume_saved_state() {
    torch::Tensor resumed = torch::zeros({1}, torch::kInt64);
    if (leader_) resumed[0] = store_.load(*trainer_, *lead_, flat_hash(theta_pub_)) ? 1 : 0;
    group_.broadcast(resumed);
    if (resumed.item<int64_t>() != 0) trainer_->broadcast_optimizer();
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
  SavedStateStore store_{cfg_, opts_};  // the leader's AdamW moments and residual on disk
  const bool delayed_ = cfg_.outer.overlap == common::Overlap::kDelayed;
  const bool arrival_ = cfg_.outer.fold == common::Fold::kArrival;  // polls for the update at each step
  RoundBase round_base_{cfg_};  // the leader's: where each round starts, what δ is against
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
