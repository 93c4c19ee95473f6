#include "outer/round/round.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace xloco::outer {

RoundDecision decide(Clock::time_point now, const RoundState& state,
                     const common::OuterConfig& config) {
  std::set<std::string> missing, skipped;
  for (const auto& p : state.active) {
    if (state.contributed.count(p)) continue;
    (state.optional.count(p) ? skipped : missing).insert(p);
  }
  const auto got = state.contributed.size();
  const double limit = state.deadline_s > 0 ? state.deadline_s : config.round_timeout_s;
  const auto deadline = state.started + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(limit));
  if (missing.empty() && got == 0 && !state.refused.empty()) {
    if (skipped.empty()) {
      return {RoundAction::kClose,
              fmt::format("every contribution was refused ({}): nobody left to wait for",
                          fmt::join(state.refused, ", "))};
    }
    if (now >= deadline) {
      return {RoundAction::kClose,
              fmt::format("deadline ({:.1f}s): every contribution was refused ({}), straggling {} "
                          "did not come", limit, fmt::join(state.refused, ", "),
                          fmt::join(skipped, ", "))};
    }
    return {RoundAction::kWait,
            fmt::format("every contribution so far was refused ({}); waiting for straggling {} "
                        "until the deadline", fmt::join(state.refused, ", "), fmt::join(skipped, ", "))};
  }
  if (missing.empty() && got > 0) {
    return {RoundAction::kClose,
            skipped.empty() ? fmt::format("all {} active providers contributed", got)
                            : fmt::format("all {} active providers contributed; not waiting for "
                                          "straggling {}", got, fmt::join(skipped, ", "))};
  }
  if (now >= deadline) {
    if (got >= static_cast<size_t>(config.min_providers)) {
      return {RoundAction::kClose,
              fmt::format("deadline ({:.1f}s): {} of {} contributed (min_providers {}); missing {}",
                          limit, got, state.active.size(), config.min_providers,
                          fmt::join(missing, ", "))};
    }
    return {RoundAction::kWait,
            fmt::format("past the deadline ({:.1f}s) with {} of min_providers {} contributions; "
                        "waiting for {}",
                        limit, got, config.min_providers,
                        missing.empty() ? std::string("a provider") : fmt::format("{}", fmt::join(missing, ", "))),
            true};
  }
  return {RoundAction::kWait, fmt::format("waiting for {}", fmt::join(missing, ", "))};
}

double round_deadline_s(std::vector<double> recent, const common::OuterConfig& config) {
  if (recent.empty()) return config.round_timeout_s;
  const auto mid = recent.begin() + static_cast<std::ptrdiff_t>(recent.size() / 2);
  std::nth_element(recent.begin(), mid, recent.end());
  double median = *mid;
  if (recent.size() % 2 == 0) median = (median + *std::max_element(recent.begin(), mid)) / 2;
  return std::clamp(config.deadline_multiple * median, std::min(config.deadline_min_s, config.round_timeout_s),
                    config.round_timeout_s);
}

StartDecision decide_start(size_t live, const common::OuterConfig& config, bool first_round,
                           double waited_s) {
  const bool grace_over = waited_s >= config.start_grace_s;
  const size_t need = first_round && !grace_over ? static_cast<size_t>(config.providers)
                                                 : static_cast<size_t>(config.min_providers);
  if (live >= need) return {true, fmt::format("{} providers live", live)};
  if (first_round && !grace_over) {
    return {false, fmt::format("waiting for providers: {} of {} connected (round 1 starts with "
                               "min_providers {} after {:.0f}s)",
                               live, need, config.min_providers, config.start_grace_s)};
  }
  return {false, fmt::format("paused: {} live providers, below min_providers {}; waiting for "
                             "providers to join or come back",
                             live, need)};
}

ResumeDecision decide_resume(bool resume, bool auto_resume, const std::optional<std::string>& latest,
                             const std::string& run_dir) {
  if (resume) return {StartFrom::kCheckpoint, "--resume"};
  if (auto_resume) {
    return latest ? ResumeDecision{StartFrom::kCheckpoint, "auto-resume: continuing from " + *latest}
                  : ResumeDecision{StartFrom::kScratch, fmt::format("auto-resume: no checkpoint under "
                                                                    "{}/ckpt, starting the run", run_dir)};
  }
  if (latest) {
    return {StartFrom::kRefuse,
            fmt::format("run directory {} already holds checkpoint {}: pass --resume to continue "
                        "it, or choose another run.name (nothing was changed)", run_dir, *latest)};
  }
  return {StartFrom::kScratch, "a new run"};
}

}  // namespace xloco::outer
