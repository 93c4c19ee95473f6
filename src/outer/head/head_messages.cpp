// The head's side of each message and each verdict (head_impl.h): the rules of membership.h
// decide, these functions send, log and change state.
#include <cmath>

#include <spdlog/spdlog.h>

#include "common/metrics.h"
#include "common/text.h"
#include "outer/head/head_impl.h"

namespace xloco::outer {

// Queues a message; a peer that is gone, or whose queue is over its budget, is dead.
bool Head::Impl::send(const std::string& peer, net::Body body, uint64_t r) {
  net::Envelope env{cfg.run.name, r, std::move(body)};
  const bool urgent = env.type() == net::MessageType::kHeartbeat;
  const auto st = net->send(peer, net::encode(env), {urgent});
  if (st == net::SendStatus::kSent) return true;
  spdlog::warn("send {} to {}: {}", net::to_string(env.type()), peer, net::to_string(st));
  if (auto it = members.find(peer); it != members.end() && is_live(it->second.state)) {
    set_state(failed_send(peer, st));
  }
  return false;
}

void Head::Impl::refuse(const std::string& peer, net::RefusalCode code, const std::string& why) {
  ledger.count_refusal(net::to_string(code));
  if (const auto v = warnings.check(peer + " " + net::to_string(code)); v.log) {
    spdlog::warn("refused {}: {}{}", peer, why, common::LogLimiter::note(v));
  }
  send(peer, net::ErrorReply{code, why}, done_rounds);
}

void Head::Impl::set_state(const Transition& t) {
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
// `faulted`: its contribution failed the head's checks, and it leaves the round's quorum too
// (aggregate.h).
void Head::Impl::leave_round(const std::string& peer, bool faulted) {
  if (!in_round || round.contributed.count(peer) || !round.active.erase(peer)) return;
  round.optional.erase(peer);
  reject(faulted ? model.aggregator().fault(peer) : model.aggregator().skip(peer));
}

// Contributions the aggregator would not add (a frame that fails to decode, an outlier norm):
// not in Δ, and the round does not wait for another from the same provider.
void Head::Impl::reject(const std::vector<Aggregator::Rejected>& rejected) {
  for (const auto& r : rejected) {
    round.contributed.erase(r.peer);
    round.refused.insert(r.peer);
    round.active.erase(r.peer);
    round.optional.erase(r.peer);
    ledger.forget_frame(r.peer);
    const auto why = fmt::format("contribution of {} for round {}: {}", r.peer, round.round, r.reason);
    ledger.note_refused_contribution(r.peer, why);
    refuse(r.peer, r.code, why);
  }
}

void Head::Impl::handle(const net::Received& rx) {
  try {
    dispatch(rx);
  } catch (const std::exception& e) {
    // A handler failed on what this peer sent: the head's state is as the handler left it
    // (each one changes state only after its checks), the peer is refused, the run goes on.
    const std::string what = common::printable(e.what(), 512);
    try {
      refuse(rx.peer, net::RefusalCode::kMalformed,
             fmt::format("a message from {} could not be handled: {}", rx.peer, what));
    } catch (const std::exception& again) {
      spdlog::error("refusing {} failed: {}", rx.peer, common::printable(again.what(), 512));
    }
  }
}

void Head::Impl::dispatch(const net::Received& rx) {
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
    if (it != members.end()) {
      set_state({rx.peer, MemberState::kLeft, "said goodbye: " + common::printable(b->reason, 200)});
    }
  } else if (auto* e = std::get_if<net::ErrorReply>(&env.body)) {
    // A peer's text: escaped, cut to 200 bytes, at most 3 lines a minute per peer.
    if (const auto v = reports.check(rx.peer); v.log) {
      spdlog::warn("provider {} reports an error: {} ({}){}", rx.peer, common::printable(e->reason, 200),
                   net::to_string(e->code), common::LogLimiter::note(v));
    }
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

void Head::Impl::on_hello(const std::string& peer, const net::Hello& h, const std::string& address) {
  const RunPosition at{common::config_hash(cfg), model.pub_round(), model.pub_hash(),
                       model.prev_hash(), model.have_last_update()};
  const Admission a = admit(Clock::now(), peer, h, members, at, net->link_state(peer), cfg.outer);
  if (opts.observer.admission) opts.observer.admission(peer, a);
  if (a.ignore && a.limited) {
    ledger.count_refusal("full_state_limit");
    if (const auto v = warnings.check(peer + " full_state"); v.log) {
      spdlog::warn("{}{}", a.reason, common::LogLimiter::note(v));
    }
    return;
  }
  if (a.ignore) return spdlog::debug("{}", a.reason);
  if (!a.admit) return refuse(peer, a.code, a.reason);
  Member& m = members[peer];
  m.shard = a.shard;
  m.last_seen = m.admitted_at = Clock::now();
  m.first_contribution = m.last_contribution = {};  // its busy share counts from here
  m.compute_since_first_s = 0;
  m.address = address;
  if (a.sync == SyncAction::kFullState) m.full_state_round = done_rounds;
  leave_round(peer);
  for (auto& [r, body] : model.join_messages(a.shard, a.sync)) {
    const auto* u = std::get_if<net::Update>(&body);
    const auto* w = std::get_if<net::Welcome>(&body);
    ledger.count_down(m, u ? u->payload.size() : w ? w->state.size() : 0);
    if (!send(peer, std::move(body), r)) return;  // gone (and dead, if it was live)
  }
  m.welcome_mark = net->link_state(peer).enqueued_bytes;
  // A newcomer or one back from the dead joins; a live one resynchronising keeps its state.
  if (a.fresh) m.state = MemberState::kJoining;  // a newcomer has no state to leave
  set_state({peer, is_live(m.state) ? m.state : MemberState::kJoining, a.reason});
  spdlog::info("provider {} {} from {}, {} live", peer, a.reason, address.empty() ? "?" : address,
               live_count(members));
}

void Head::Impl::on_contribution(const std::string& peer, uint64_t r, const net::Contribution& c) {
  const auto v = judge_contribution(peer, r, c.tokens, round_token_allowance(cfg, r), members,
                                    in_round ? &round : nullptr, done_rounds,
                                    frame_problem(c.payload, model.fragment(r).layout, cfg.outer));
  if (opts.observer.contribution) opts.observer.contribution(peer, r, v);
  if (v.action == ContributionAction::kRefuse) {
    if (in_round && r == round.round && round.active.count(peer)) {
      ledger.note_refused_contribution(peer, v.reason);
      round.refused.insert(peer);
      // it has handed in what it had for this round; a frame or token count no honest
      // provider sends takes it out of the round's quorum as well
      leave_round(peer, v.code == net::RefusalCode::kBadFrame || v.code == net::RefusalCode::kBadTokens);
    }
    return refuse(peer, v.code, v.reason);
  }
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
  if (std::isfinite(c.compute_s)) m.link_s = std::max(0.0, m.round_s.back() - c.compute_s);
  m.frame_bytes = static_cast<double>(c.payload.size());
  m.train_loss = c.train_loss;
  const auto now = Clock::now();
  if (m.first_contribution == Clock::time_point{}) {
    m.first_contribution = now;
  } else if (std::isfinite(c.compute_s) && c.compute_s > 0) {
    m.compute_since_first_s += c.compute_s;
  }
  m.last_contribution = now;
  ledger.count_up(m, c.payload.size());
  reject(model.aggregator().add(peer, c.payload, c.tokens));
}

}  // namespace xloco::outer
