// The round state machine's decisions as pure functions of (now, state, config) with an
// injected clock (torchft style): no sockets, no threads, testable on their own. They return
// the decision and the reason, which the head logs. A round that cannot close is state, not an
// exception.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "common/config.h"

namespace xloco::outer {

using Clock = std::chrono::steady_clock;

struct RoundState {
  uint64_t round = 0;                          // the round in progress (1-based)
  Clock::time_point started{};                 // when ROUND_START went out
  std::set<std::string> active;                // providers expected to contribute
  std::map<std::string, uint64_t> contributed; // provider -> tokens, this round
};

enum class RoundAction {
  kWait,   // keep collecting contributions
  kClose,  // aggregate what arrived and publish the update
};

struct RoundDecision {
  RoundAction action = RoundAction::kWait;
  std::string reason;
};

// Close when every active provider has contributed, or at the deadline when at least
// outer.min_providers have; otherwise wait (saying for whom).
RoundDecision decide(Clock::time_point now, const RoundState& state,
                     const common::OuterConfig& config);

struct StartDecision {
  bool start = false;
  std::string reason;
};
// Whether the next round may start: enough providers are connected.
StartDecision decide_start(size_t connected, const common::OuterConfig& config, bool first_round);

}  // namespace xloco::outer
