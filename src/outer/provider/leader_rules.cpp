#include "outer/provider/leader_rules.h"

#include <fmt/format.h>

namespace xloco::outer {

const char* to_string(LeaderAction action) {
  switch (action) {
    case LeaderAction::kRunRound: return "run round";
    case LeaderAction::kApplyUpdate: return "apply update";
    case LeaderAction::kResync: return "resync";
    case LeaderAction::kRejoined: return "rejoined";
    case LeaderAction::kRepeatHello: return "repeat hello";
    case LeaderAction::kStop: return "stop";
    case LeaderAction::kFatal: return "fatal";
    case LeaderAction::kReport: return "report";
    case LeaderAction::kIgnore: return "ignore";
  }
  return "?";
}

LeaderVerdict on_head_message(const LeaderState& s, const net::Envelope& m) {
  const uint64_t r = m.round;
  const uint64_t next = s.done_round + 1;
  if (std::holds_alternative<net::RoundStart>(m.body)) {
    if (s.rejoining) return {LeaderAction::kIgnore, "resynchronising"};
    if (r == next) return {LeaderAction::kRunRound, fmt::format("round {} starts", r)};
    return {LeaderAction::kResync,
            fmt::format("round {} starts, but this provider holds round {}", r, s.done_round)};
  }
  if (std::holds_alternative<net::Update>(m.body)) {
    if (r == next) return {LeaderAction::kApplyUpdate, fmt::format("update closing round {}", r)};
    if (r > next && !s.rejoining) {
      return {LeaderAction::kResync,
              fmt::format("update for round {}, but this provider holds round {}", r, s.done_round)};
    }
    return {LeaderAction::kIgnore, fmt::format("update for round {}: not the next one", r)};
  }
  if (const auto* w = std::get_if<net::Welcome>(&m.body)) {
    if (w->shard_index != s.shard_index || w->shard_count != s.shard_count) {
      return {LeaderAction::kFatal,
              fmt::format("the head moved this provider from shard {}/{} to {}/{}; restart it",
                          s.shard_index, s.shard_count, w->shard_index, w->shard_count)};
    }
    return {LeaderAction::kRejoined,
            fmt::format("back in the run at round {} ({})", r,
                        w->state.empty() ? "its state was current" : "full state received")};
  }
  if (const auto* b = std::get_if<net::Bye>(&m.body)) {
    return {LeaderAction::kStop, fmt::format("the head says goodbye ({})", b->reason)};
  }
  if (const auto* e = std::get_if<net::ErrorReply>(&m.body)) {
    const std::string why = fmt::format("{} ({})", e->reason, net::to_string(e->code));
    if (e->code == net::RefusalCode::kRejoin) {
      return {s.rejoining ? LeaderAction::kRepeatHello : LeaderAction::kResync, why};
    }
    if (net::is_fatal(e->code)) return {LeaderAction::kFatal, "the head refused it: " + why};
    return {LeaderAction::kReport, "the head reports " + why};
  }
  return {LeaderAction::kIgnore, ""};
}

SavedStateVerdict judge_saved_state(const SavedProviderState& saved, uint64_t head_round,
                                    const std::string& pub_hash, const std::string& config_hash) {
  const uint64_t c = saved.round;
  if (saved.config_hash != config_hash) {
    return {false, fmt::format("it was saved by a run of another config (hash {}, this run's {})",
                               saved.config_hash, config_hash)};
  }
  if (c == 0) return {false, "it records no round"};
  if (head_round + 1 + kMaxStateLag < c) {
    return {false, fmt::format("it was saved after round {}, but the head is back at round {}, "
                               "more than {} rounds before it", c, head_round, kMaxStateLag)};
  }
  if (head_round > c + kMaxStateLag) {
    return {false, fmt::format("it was saved after round {}, {} rounds before the head's {} "
                               "(more than {} behind)", c, head_round - c, head_round, kMaxStateLag)};
  }
  if (head_round + 1 == c) {
    return {true, pub_hash == saved.base_hash
                      ? fmt::format("saved after its contribution to round {}, which is still "
                                    "open (theta_pub {} as then)", c, pub_hash)
                      : fmt::format("saved after round {}; the head redid the rounds before it "
                                    "(theta_pub {}, not {} as then)", c, pub_hash, saved.base_hash)};
  }
  if (head_round < c) {
    return {true, fmt::format("saved after round {}; the head went back to round {} (an older "
                              "checkpoint), and the moments carry over", c, head_round)};
  }
  return {true, head_round == c
                    ? fmt::format("saved after round {}, the round the head closed last", c)
                    : fmt::format("saved after round {}; the head closed {} more while it was down",
                                  c, head_round - c)};
}

}  // namespace xloco::outer
