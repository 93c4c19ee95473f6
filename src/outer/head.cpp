#include "outer/head.h"

#include <filesystem>

#include <spdlog/spdlog.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/metrics.h"
#include "common/process.h"
#include "net/protocol.h"
#include "outer/global_model.h"
#include "outer/ledger.h"
#include "outer/round.h"
#include "outer/status_http.h"

namespace xloco::outer {
namespace fs = std::filesystem;

struct Head::Impl {
  common::Config cfg;
  HeadOptions opts;
  std::unique_ptr<net::Transport> net;
  GlobalModel model;
  Members members;
  RoundState round;
  bool in_round = false, first_round = true;
  uint64_t done_rounds = 0;
  const int total;
  RunLedger ledger;
  std::string last_wait_reason;
  const Clock::time_point t0 = Clock::now();
  Clock::time_point last_heartbeat = t0, last_publish{}, last_listen = t0, listening_since = t0;
  std::unique_ptr<StatusServer> status;
  std::atomic<bool> stop_requested{false};

  Impl(const common::Config& c, HeadOptions o, std::unique_ptr<net::Transport> t)
      : cfg(c), opts(std::move(o)), net(std::move(t)), model(c, opts.init),
        total(common::total_rounds(c)), ledger(cfg, opts.run_dir) {
    const auto start = decide_resume(opts.resume, opts.auto_resume,
                                     common::latest_checkpoint(ckpt_root()), opts.run_dir);
    XLOCO_ENFORCE(start.from != StartFrom::kRefuse, common::ConfigError, "{}", start.reason);
    if (opts.auto_resume) spdlog::info("{}", start.reason);
    if (start.from == StartFrom::kCheckpoint) {
      const auto st = model.resume(ckpt_root(), common::config_hash(cfg));
      ledger.restore(st, members);
      done_rounds = st.round;
    }
    if (!opts.http.empty()) status = StatusServer::start(opts.http, opts.run_dir);
    // A frame is at most the parameters in fp32 plus its tables; a peer's queue holds at most
    // a full state and an update before it counts as not keeping up.
    const auto frame = model.max_frame_bytes();
    net->set_limits({frame, 2 * frame + (std::int64_t{16} << 20)});
  }

  std::string ckpt_root() const { return (fs::path(opts.run_dir) / "ckpt").string(); }

  void checkpoint() {
    const auto st = ledger.checkpoint_state(done_rounds, members);
    spdlog::info("checkpoint {}", model.write_checkpoint(ckpt_root(), st, cfg.outer.keep_checkpoints));
  }

  // ------------------------------------------------------------------ carrying out verdicts
  // Queues a message; a peer that is gone, or whose queue is over its budget, is dead.
  void send(const std::string& peer, net::Body body, uint64_t r) {
    net::Envelope env{cfg.run.name, r, std::move(body)};
    const bool urgent = env.type() == net::MessageType::kHeartbeat;
    const auto st = net->send(peer, net::encode(env), {urgent});
    if (st == net::SendStatus::kSent) return;
    spdlog::warn("send {} to {}: {}", net::to_string(env.type()), peer, net::to_string(st));
    if (auto it = members.find(peer); it != members.end() && is_live(it->second.state)) {
      set_state(failed_send(peer, st));
    }
  }

  void refuse(const std::string& peer, net::RefusalCode code, const std::string& why) {
    spdlog::warn("refused {}: {}", peer, why);
    send(peer, net::ErrorReply{code, why}, done_rounds);
  }

  void set_state(const Transition& t) {
    Member& m = members[t.name];
    if (const auto line = transition_log(t.name, m.state, t)) {
      const bool bad = t.to == MemberState::kDead || t.to == MemberState::kStraggling;
      spdlog::log(bad ? spdlog::level::warn : spdlog::level::info, "{}", *line);
    }
    m.state = t.to;
    m.reason = t.reason;
    if (t.backoff) {
      m.backoff_until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(kStallBackoff * cfg.outer.dead_after_s));
    }
    if (opts.observer.transition) opts.observer.transition(t);
    if (!is_live(t.to)) {
      leave_round(t.name);
      net->drop_queue(t.name);  // frees the frames queued for it
    }
  }

  // A provider that has not contributed to the round in progress will not: it left, died, or
  // (re)joined and takes part from the next round. Work it already handed in counts.
  void leave_round(const std::string& peer) {
    if (!in_round || round.contributed.count(peer) || !round.active.erase(peer)) return;
    round.optional.erase(peer);
    reject(model.aggregator().skip(peer));
  }

  // Contributions whose frames failed to decode when their turn came.
  void reject(const std::vector<Aggregator::Rejected>& rejected) {
    for (const auto& r : rejected) {
      round.contributed.erase(r.peer);
      ledger.forget_frame(r.peer);
      refuse(r.peer, net::RefusalCode::kBadFrame,
             fmt::format("contribution of {} for round {}: {}", r.peer, round.round, r.reason));
    }
  }

  // ------------------------------------------------------------------ messages
  void handle(const net::Received& rx) {
    net::Envelope env;
    try {
      env = net::decode(rx.message, cfg.run.name);
    } catch (const net::ProtocolError& e) {
      return refuse(rx.peer, net::RefusalCode::kMalformed, fmt::format("bad message from {}: {}", rx.peer, e.what()));
    }
    auto it = members.find(rx.peer);
    const bool member = it != members.end() && is_live(it->second.state);
    if (member) it->second.last_seen = Clock::now();
    if (auto* h = std::get_if<net::Hello>(&env.body)) {
      on_hello(rx.peer, *h, rx.address);
    } else if (auto* c = std::get_if<net::Contribution>(&env.body)) {
      on_contribution(rx.peer, env.round, *c);
    } else if (auto* b = std::get_if<net::Bye>(&env.body)) {
      if (it != members.end()) set_state({rx.peer, MemberState::kLeft, "said goodbye: " + b->reason});
    } else if (auto* e = std::get_if<net::ErrorReply>(&env.body)) {
      spdlog::warn("provider {} reports an error: {} ({})", rx.peer, e->reason, net::to_string(e->code));
    } else if (auto* beat = std::get_if<net::Heartbeat>(&env.body)) {
      if (!member) {
        return refuse(rx.peer, net::RefusalCode::kRejoin, fmt::format("heartbeat from {}, which is not a member (declared dead, or the head restarted): send HELLO", rx.peer));
      }
      it->second.step = beat->step;
      it->second.tokens_per_s = beat->tokens_per_s;
    } else {
      refuse(rx.peer, net::RefusalCode::kUnexpected, fmt::format("{} from a provider", net::to_string(env.type())));
    }
  }

  void on_hello(const std::string& peer, const net::Hello& h, const std::string& address) {
    const RunPosition at{common::config_hash(cfg), done_rounds, model.pub_hash(), model.prev_hash(),
                         !model.last_update().empty()};
    const Admission a = admit(Clock::now(), peer, h, members, at, net->link_state(peer), cfg.outer);
    if (opts.observer.admission) opts.observer.admission(peer, a);
    if (a.ignore) return spdlog::debug("{}", a.reason);
    if (!a.admit) return refuse(peer, a.code, a.reason);
    Member& m = members[peer];
    m.shard = a.shard;
    m.last_seen = m.admitted_at = Clock::now();
    m.address = address;
    leave_round(peer);
    const net::Welcome w = model.welcome(a.shard, a.sync == SyncAction::kFullState);
    if (a.sync == SyncAction::kUpdate) {
      send(peer, net::Update{model.last_update()}, done_rounds);  // before the WELCOME: order is kept
      ledger.count_down(m, model.last_update().size());
    }
    ledger.count_down(m, w.state.size());
    send(peer, w, done_rounds);
    // A newcomer or one back from the dead joins; a live one resynchronising keeps its state.
    if (a.fresh) m.state = MemberState::kJoining;  // a newcomer has no state to leave
    set_state({peer, is_live(m.state) ? m.state : MemberState::kJoining, a.reason});
    spdlog::info("provider {} {} from {}, {} live", peer, a.reason, address.empty() ? "?" : address,
                 live_count(members));
  }

  void on_contribution(const std::string& peer, uint64_t r, const net::Contribution& c) {
    const auto v = judge_contribution(peer, r, c.tokens, members, in_round ? &round : nullptr,
                                      done_rounds, frame_problem(c.payload, model.layout()));
    if (opts.observer.contribution) opts.observer.contribution(peer, r, v);
    if (v.action == ContributionAction::kRefuse) return refuse(peer, v.code, v.reason);
    if (v.action == ContributionAction::kDrop) {
      if (v.late) ledger.count_late();
      return spdlog::warn("{}", v.reason);
    }
    round.contributed[peer] = c.tokens;
    ledger.note_frame(peer, common::hash_hex(c.payload.data(), c.payload.size()));
    Member& m = members[peer];
    m.reason = fmt::format("contributed to round {}", r);
    m.round_s.push_back(seconds_since(round.started));
    if (m.round_s.size() > kRoundTimesKept) m.round_s.pop_front();
    if (m.state == MemberState::kStraggling) {
      set_state({peer, MemberState::kActive, fmt::format("on time again in round {}", r)});
    }
    m.compute_s = c.compute_s;
    ledger.count_up(m, c.payload.size());
    reject(model.aggregator().add(peer, c.payload, c.tokens));
  }

  // ------------------------------------------------------------------ rounds
  void try_start_round() {
    const auto d = decide_start(live_count(members), cfg.outer, first_round, seconds_since(t0));
    if (d.start) {
      first_round = false;
      start_round();
    } else if (d.reason != last_wait_reason) {
      spdlog::info("{}", d.reason);
      last_wait_reason = d.reason;
    }
  }

  void start_round() {
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
    model.aggregator().begin(aggregation_order(round, members));
    const std::set<std::string> to_start = round.active;  // a failed send edits round.active
    for (const auto& p : to_start) send(p, net::RoundStart{}, round.round);
  }

  void close_round(const std::string& reason) {
    for (const auto& t : stragglers(round, reason)) set_state(t);
    auto closed = model.close_round();
    reject(closed.rejected);
    for (auto& [name, m] : members) {
      if (!is_live(m.state)) continue;
      send(name, net::Update{closed.update}, round.round);
      ledger.count_down(m, closed.update.size());
    }
    in_round = false;
    done_rounds = round.round;
    RoundRecord rec = ledger.close_round(round, reason, members, closed.update.size());
    const bool last = static_cast<int>(done_rounds) >= total;
    rec.round_wall_s = seconds_since(round.started);  // its ROUND_START to the next one
    rec.sync_overhead = std::max(0.0, 1.0 - rec.compute_s / rec.round_wall_s);
    // The next round starts before the head evaluates or checkpoints, so providers never wait
    // for either: both overlap the providers' inner steps.
    if (!last) try_start_round();
    model.rehash();
    rec.theta_pub_hash = model.pub_hash();
    if (last || (cfg.outer.eval_every > 0 && done_rounds % cfg.outer.eval_every == 0)) {
      const auto e = model.evaluate([this] { pump(); });
      ledger.set_eval(e.loss, e.accuracy, rec);
    }
    ledger.write_round(rec);
    if (opts.observer.round_closed) opts.observer.round_closed(rec);
    if (!last && cfg.outer.checkpoint_every > 0 && done_rounds % cfg.outer.checkpoint_every == 0) {
      checkpoint();
    }
  }

  // ------------------------------------------------------------------ the loop
  int run() {
    common::install_forwarding_handlers();
    ledger.announce();
    while (static_cast<int>(done_rounds) < total) {
      if (common::pending_signal() != 0 || stop_requested) {
        spdlog::warn("head interrupted after round {}; checkpointing", done_rounds);
        checkpoint();
        broadcast(net::Bye{"head interrupted"});
        return 130;
      }
      if (auto rx = net->receive(std::chrono::milliseconds(50))) handle(*rx);
      housekeeping();
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

  // While the head evaluates: answer what is waiting (HELLO, contributions to the round in
  // progress, heartbeats) and keep heartbeats and /status going. Rounds close only in run().
  void pump() {
    while (auto rx = net->receive(std::chrono::milliseconds(0))) handle(*rx);
    housekeeping();
  }

  // Liveness (unless the head was not listening), heartbeats, the status snapshot.
  void housekeeping() {
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

  void publish_status(const std::string& state) {
    if (!status) return;
    const std::string why = in_round ? decide(Clock::now(), round, cfg.outer).reason : last_wait_reason;
    status->publish(ledger.status(state, why, done_rounds, in_round ? &round : nullptr, members,
                                  model.pub_hash()));
  }

  void broadcast(const net::Body& body) {
    for (const auto& [name, m] : members) {
      if (is_live(m.state)) send(name, body, done_rounds);
    }
  }

  void finish() {
    publish_status("done");
    checkpoint();
    broadcast(net::Bye{"run complete"});
    ledger.finish(done_rounds, model.pub_hash(), model.param_bytes(),
                  opts.summary_file.empty() ? (fs::path(opts.run_dir) / "summary.json").string()
                                            : opts.summary_file);
  }
};

Head::Head(const common::Config& config, HeadOptions options,
           std::unique_ptr<net::Transport> transport)
    : impl_(std::make_unique<Impl>(config, std::move(options), std::move(transport))) {}
Head::~Head() = default;
int Head::run() { return impl_->run(); }
void Head::stop() { impl_->stop_requested = true; }
const RunSummary& Head::summary() const { return impl_->ledger.summary(); }

}  // namespace xloco::outer
