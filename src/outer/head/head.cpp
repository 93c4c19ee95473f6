#include "outer/head/head.h"

#include <algorithm>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/metrics.h"
#include "common/process.h"
#include "outer/head/head_impl.h"

namespace xloco::outer {
namespace fs = std::filesystem;

Head::Impl::Impl(const common::Config& c, HeadOptions o, std::unique_ptr<net::Transport> t)
    : cfg(c), opts(std::move(o)), net(std::move(t)), model(c, opts.init),
      total(common::total_rounds(c)), ledger(cfg, opts.run_dir, [this](const RoundRecord& r) {
        if (opts.observer.round_closed) opts.observer.round_closed(r);
        if (status) status->add_round(r);  // the dashboard's history
      }) {
  // A run directory the head cannot write is found now, not at the first checkpoint; what an
  // interrupted checkpoint left behind goes.
  common::check_writable(opts.run_dir);
  common::check_writable(ckpt_root());
  for (const auto& stale : common::remove_stale_temp(ckpt_root())) {
    spdlog::info("removed {} under {}, left by an interrupted checkpoint", stale, ckpt_root());
  }
  // Any checkpoint directory counts here, complete or not: resume() verifies each (once), and a
  // run whose checkpoints are all damaged is refused rather than started again over them.
  const auto found = common::checkpoint_candidates(ckpt_root());
  const auto start = decide_resume(opts.resume, opts.auto_resume,
                                   found.empty() ? std::nullopt : std::optional(found.front()),
                                   opts.run_dir);
  XLOCO_ENFORCE(start.from != StartFrom::kRefuse, common::ConfigError, "{}", start.reason);
  if (opts.auto_resume) spdlog::info("{}", start.reason);
  if (start.from == StartFrom::kCheckpoint) {
    const auto st = model.resume(ckpt_root(), common::config_hash(cfg));
    ledger.restore(st, members);
    done_rounds = st.round;
  }
  if (!opts.http.empty()) {
    RunInfo info;
    info.run = cfg.run.name;
    info.total_rounds = total;
    info.inner_steps = cfg.outer.inner_steps;
    info.providers = cfg.outer.providers;
    info.config = common::to_json(cfg);
    if (!opts.baseline.empty()) {  // read before the port opens: a bad file is an error at start
      info.baseline = read_baseline(opts.baseline);
      info.baseline_file = opts.baseline;
    }
    status = StatusServer::start(opts.http, opts.run_dir, opts.http_token);
    status->set_run(std::move(info));
    // A resumed run's curves start where it started, not at its checkpoint.
    if (done_rounds > 0) {
      try {
        for (const auto& r : read_round_records(ledger.metrics_path())) {
          if (r.round <= done_rounds) status->add_round(r);
        }
      } catch (const std::exception& e) {  // the curves are for humans: the run goes on
        spdlog::warn("dashboard: the rounds before the resume are not shown ({})", e.what());
      }
    }
    publish_status("waiting");  // the run's name and position from the first request on
  } else {
    XLOCO_ENFORCE(opts.baseline.empty(), common::ConfigError,
                  "--baseline {} is drawn by the dashboard: it needs --http", opts.baseline);
  }
  // A frame is at most the parameters in fp32 plus its tables; a peer's queue may hold a full
  // state and two updates, beyond which it does not keep up (and held frames cost memory).
  net->set_limits({model.max_frame_bytes(),
                   model.max_frame_bytes() + 2 * model.max_update_bytes() + (std::int64_t{16} << 20),
                   /*max_frames=*/2});
}

// A checkpoint that cannot be written (a full disk) is logged and counted, and the previous one
// stands; the head goes on and tries again after the next round.
bool Head::Impl::checkpoint() {
  const auto st = ledger.checkpoint_state(done_rounds, members);
  try {
    spdlog::info("checkpoint {}", model.write_checkpoint(ckpt_root(), st, cfg.outer.keep_checkpoints));
  } catch (const common::Error& e) {
    ledger.checkpoint_failed(e.what());
    checkpoint_failed_at = done_rounds;
    spdlog::error("{} (the previous checkpoint stands; retried after the next round)", e.what());
    return false;
  }
  ledger.checkpoint_written(done_rounds);
  checkpoint_failed_at.reset();
  return true;
}

void Head::Impl::try_start_round() {
  size_t ready = 0;
  for (const auto& [name, m] : members) ready += takes_part(m, net->link_state(name)) ? 1 : 0;
  const auto d = decide_start(ready, cfg.outer, first_round, seconds_since(t0));
  if (d.start) {
    first_round = false;
    start_round();
  } else if (d.reason != last_wait_reason) {
    spdlog::info("{}", d.reason);
    last_wait_reason = d.reason;
  }
}

void Head::Impl::start_round() {
  round = RoundState{};
  round.round = done_rounds + 1;
  round.started = Clock::now();
  std::vector<double> recent;
  for (auto& [name, m] : members) {
    if (!takes_part(m, net->link_state(name))) continue;
    round.active.insert(name);
    if (m.state == MemberState::kStraggling) round.optional.insert(name);
    recent.insert(recent.end(), m.round_s.begin(), m.round_s.end());
    if (m.state == MemberState::kJoining) set_state({name, MemberState::kActive, fmt::format("in round {}", round.round)});
  }
  round.deadline_s = round_deadline_s(recent, cfg.outer);
  in_round = true;
  last_wait_reason.clear();
  ledger.new_round();
  model.aggregator().begin(aggregation_order(round, members), round_token_allowance(cfg, round.round),
                           &model.fragment(round.round).layout,
                           model.fragment_index(round.round),
                           // a fragment's first sync covers fewer steps than its later ones
                           cfg.outer.fragments == 1 || round.round > static_cast<uint64_t>(cfg.outer.fragments),
                           round.optional);
  const std::set<std::string> to_start = round.active;  // a failed send edits round.active
  for (const auto& p : to_start) send(p, net::RoundStart{}, round.round);
}

void Head::Impl::close_round(const std::string& reason) {
  const auto wall0 = Clock::now();
  const double cpu0 = thread_cpu_s();
  // A round never waits for an evaluation: one still holding an update back is cancelled.
  if (model.has_pending()) evaluated(*model.end_evaluation(false, true));
  for (const auto& t : stragglers(round, reason)) set_state(t);
  auto closed = model.close_round();
  reject(closed.rejected);
  if (closed.discarded) {
    spdlog::error("round {}: {}", round.round, *closed.discarded);
    ledger.count_discarded();
  }
  send_update(closed.update);
  in_round = false;
  done_rounds = round.round;
  // A round with nothing accepted (no quorum to judge by, every contribution refused) still
  // closes: θ is unchanged, and the record and the log say so.
  const std::string why = closed.accepted > 0 || closed.discarded
                              ? reason
                              : fmt::format("{}; no contribution accepted: theta unchanged", reason);
  if (closed.accepted == 0 && !closed.discarded) {
    spdlog::warn("round {}: no contribution accepted ({} refused): theta unchanged", round.round,
                 closed.rejected.size());
  }
  RoundRecord rec = ledger.close_round(round, why, members, closed.update.bytes());
  const bool last = static_cast<int>(done_rounds) >= total;
  rec.round_wall_s = seconds_since(round.started);  // its ROUND_START to the next one
  rec.sync_overhead = std::max(0.0, 1.0 - rec.compute_s / rec.round_wall_s);
  ledger.note_utilization(1.0 - rec.sync_overhead);
  // The next round starts before the head evaluates or checkpoints, so providers never wait
  // for either: both overlap the providers' inner steps.
  if (!last) try_start_round();
  if (!closed.deferred) model.rehash();
  rec.close_s = seconds_since(wall0);
  rec.close_cpu_s = thread_cpu_s() - cpu0;
  note_closed(closed, rec);
  const bool evaluate = last || (cfg.outer.eval_every > 0 && done_rounds % cfg.outer.eval_every == 0);
  if (evaluate && eval_due) ledger.skip_eval(*eval_due, "a later round was due before it could start");
  if (evaluate) eval_due = done_rounds;
  ledger.write_round(rec, evaluate, closed.deferred);
  checkpoint_due = checkpoint_due || (!last && cfg.outer.checkpoint_every > 0 &&
                                      done_rounds % cfg.outer.checkpoint_every == 0);
  background();
}

void Head::Impl::send_update(const net::Update& update) {
  for (auto& [name, m] : members) {
    if (!is_live(m.state)) continue;
    net::Update mine = model.update_for(name, update);  // relay: without its own frame
    const size_t bytes = mine.bytes();
    send(name, std::move(mine), round.round);
    ledger.count_down(m, bytes);
  }
}

void Head::Impl::note_closed(const GlobalModel::Closed& closed, RoundRecord& rec) {
  rec.theta_pub_hash = closed.deferred ? "" : model.pub_hash();
  rec.discarded = closed.discarded.value_or("");
  for (const auto& [peer, clip] : closed.clipped) rec.clipped[peer] = clip;
  for (const auto& [peer, change] : closed.scores) {
    rec.scores[peer] = change;
    if (const auto it = members.find(peer); it != members.end()) it->second.score = change;
  }
  rec.trust_scaled = closed.trust_scaled;
  rec.trust_ratio = closed.trust_ratio;
  if (closed.trust_scaled > 0) {
    spdlog::warn("round {}: outer.trust_region scaled {} tensor(s) of the step (largest {:.3g}× "
                 "the radius)", round.round, closed.trust_scaled, closed.trust_ratio);
  }
}

// Starts and collects evaluations, and writes a checkpoint that waited for θ_pub.
void Head::Impl::background() {
  if (auto e = model.end_evaluation(false, false)) evaluated(*e);
  if (eval_due && !model.evaluating()) {
    if (model.pub_round() == *eval_due) {
      model.start_evaluation();
    } else {
      ledger.skip_eval(*eval_due, "theta_pub had moved on before it could start");
    }
    eval_due.reset();
  }
  const bool retry_now = !checkpoint_failed_at || done_rounds > *checkpoint_failed_at;
  if (checkpoint_due && !model.has_pending() && retry_now) checkpoint_due = !checkpoint();
}

void Head::Impl::evaluated(const GlobalModel::Evaluation& e) {
  if (e.stats) {
    ledger.record_eval(e.round, e.stats->loss, e.stats->accuracy);
  } else {
    ledger.skip_eval(e.round, "cancelled: still running when a second round closed after it");
  }
  ledger.record_hash(model.pub_round(), model.pub_hash());
}

int Head::Impl::run() {
  common::install_forwarding_handlers();
  ledger.announce();
  while (static_cast<int>(done_rounds) < total) {
    if (common::pending_signal() != 0 || stop_requested) {
      spdlog::warn("head interrupted after round {}; checkpointing", done_rounds);
      if (model.evaluating()) evaluated(*model.end_evaluation(false, true));
      if (eval_due) ledger.skip_eval(*eval_due, "the head was interrupted");
      checkpoint();
      broadcast(net::Bye{"head interrupted"});
      drain(2.0);  // a signal wants a quick exit: the BYE, not a model-sized update
      return 130;
    }
    if (auto rx = net->receive(std::chrono::milliseconds(50))) handle(*rx);
    housekeeping();
    background();
    if (!in_round) {
      try_start_round();
      continue;
    }
    const auto d = decide(Clock::now(), round, cfg.outer);
    if (d.action == RoundAction::kClose) {
      close_round(d.reason);
    } else if (d.overdue && d.reason != last_wait_reason) {
      spdlog::warn("round {}: {}", round.round, d.reason);
      last_wait_reason = d.reason;
    }
  }
  finish();
  return 0;
}

// Liveness (unless the head was not listening), heartbeats, the status snapshot.
void Head::Impl::housekeeping() {
  const auto now = Clock::now();
  const auto gap = now - std::exchange(last_listen, now);
  if (gap >= std::chrono::seconds(1)) listening_since = now;
  std::map<std::string, net::LinkState> links;
  for (auto& [name, m] : members) {
    if (!is_live(m.state)) continue;
    m.last_seen = forgiven(m.last_seen, now, gap);
    links[name] = net->link_state(name);
  }
  for (const auto& t : liveness(now, listening_since, members, links, cfg.outer)) set_state(t);
  if (std::chrono::duration<double>(now - last_heartbeat).count() >= cfg.outer.heartbeat_s) {
    last_heartbeat = now;
    broadcast(net::Heartbeat{});
  }
  if (std::chrono::duration<double>(now - last_publish).count() >= 0.25) {
    last_publish = now;
    publish_status(in_round ? "running" : (first_round ? "waiting" : "paused"));
  }
}

void Head::Impl::publish_status(const std::string& state) {
  if (!status) return;
  const std::string why = in_round ? decide(Clock::now(), round, cfg.outer).reason : last_wait_reason;
  HeadStatus s = ledger.status(state, why, done_rounds, in_round ? &round : nullptr, members,
                               model.pub_hash());
  if (state != "done") s.advice = ledger.advice(members, model.param_bytes() / 4);
  status->publish(std::move(s));
}

void Head::Impl::broadcast(const net::Body& body) {
  for (const auto& [name, m] : members) {
    if (is_live(m.state)) send(name, body, done_rounds);
  }
}

void Head::Impl::drain(double limit_s) {
  const auto start = Clock::now();
  bool said = false;
  for (;;) {
    std::size_t queued = 0, peers = 0;
    Clock::time_point moved{};
    for (const auto& [name, m] : members) {
      if (!is_live(m.state)) continue;
      const auto ls = net->link_state(name);
      if (ls.queued_bytes == 0) continue;
      queued += ls.queued_bytes;
      ++peers;
      moved = std::max(moved, ls.last_progress);
    }
    if (queued == 0) return;
    const auto now = Clock::now();
    if (!said) {
      spdlog::info("sending the last {} to {} providers before exiting",
                   common::human_bytes(static_cast<double>(queued)), peers);
      said = true;
    }
    if (std::chrono::duration<double>(now - start).count() > limit_s ||
        std::chrono::duration<double>(now - moved).count() > cfg.outer.dead_after_s) {
      spdlog::warn("exiting with {} still queued for {} providers (their links stopped taking "
                   "it, or it took over {:.0f}s): they will miss the end of the run",
                   common::human_bytes(static_cast<double>(queued)), peers, limit_s);
      return;
    }
    (void)net->receive(std::chrono::milliseconds(50));  // pumps the queues; nothing is answered now
  }
}

void Head::Impl::finish() {
  if (model.evaluating()) evaluated(*model.end_evaluation(true, false));
  if (eval_due) {  // the last round's, always
    model.start_evaluation();
    eval_due.reset();
    evaluated(*model.end_evaluation(true, false));
  }
  publish_status("done");
  checkpoint();
  broadcast(net::Bye{"run complete"});
  // At 100 M+ parameters the last update is still streaming out: without this its tail and
  // the BYE behind it would die with the head, and the providers wait outer.head_timeout_s.
  drain(cfg.outer.round_timeout_s);
  ledger.finish(done_rounds, model.pub_hash(), model.param_bytes(),
                opts.summary_file.empty() ? (fs::path(opts.run_dir) / "summary.json").string()
                                          : opts.summary_file);
}

Head::Head(const common::Config& config, HeadOptions options,
           std::unique_ptr<net::Transport> transport)
    : impl_(std::make_unique<Impl>(config, std::move(options), std::move(transport))) {}
Head::~Head() = default;
int Head::run() { return impl_->run(); }
void Head::stop() { impl_->stop_requested = true; }
const RunSummary& Head::summary() const { return impl_->ledger.summary(); }

}  // namespace xloco::outer
