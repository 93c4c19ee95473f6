#include "outer/round.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace xloco::outer {

RoundDecision decide(Clock::time_point now, const RoundState& state,
                     const common::OuterConfig& config) {
  std::set<std::string> missing;
  for (const auto& p : state.active) {
    if (!state.contributed.count(p)) missing.insert(p);
  }
  const auto got = state.contributed.size();
  if (missing.empty() && got > 0) {
    return {RoundAction::kClose, fmt::format("all {} active providers contributed", got)};
  }
  const auto deadline = state.started + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(config.round_timeout_s));
  if (now >= deadline) {
    if (got >= static_cast<size_t>(config.min_providers)) {
      return {RoundAction::kClose,
              fmt::format("deadline: {} of {} contributed (min_providers {}); missing {}", got,
                          state.active.size(), config.min_providers, fmt::join(missing, ", "))};
    }
    return {RoundAction::kWait,
            fmt::format("past the deadline with {} of min_providers {} contributions; waiting",
                        got, config.min_providers)};
  }
  return {RoundAction::kWait, fmt::format("waiting for {}", fmt::join(missing, ", "))};
}

StartDecision decide_start(size_t connected, const common::OuterConfig& config, bool first_round) {
  const size_t need = first_round ? static_cast<size_t>(config.providers)
                                  : static_cast<size_t>(config.min_providers);
  if (connected >= need) return {true, fmt::format("{} providers connected", connected)};
  return {false, fmt::format("{} of {} providers connected; waiting", connected, need)};
}

}  // namespace xloco::outer
