// The round state machine's decisions as pure functions of (now, state, config) with an
// injected clock (torchft style): no sockets, no threads, testable on their own. They return
// the decision and the reason, which the head logs and serves on /status. A round that cannot
// close, or cannot start, is state, not an exception. Membership's rules are in membership.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <ctime>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/config.h"

namespace xloco::outer {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The CPU time the calling thread has used, in seconds.
inline double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct RoundState {
  uint64_t round = 0;                          // the round in progress (1-based)
  Clock::time_point started{};                 // when ROUND_START went out
  double deadline_s = 0;                       // from round_deadline_s(); 0 = outer.round_timeout_s
  std::set<std::string> active;                // providers sent the round; their contributions count
  std::set<std::string> optional;              // of those, stragglers the round does not wait for
  std::map<std::string, uint64_t> contributed; // provider -> tokens, this round
  std::set<std::string> refused;               // handed in a contribution that was refused
};

enum class RoundAction {
  kWait,   // keep collecting contributions
  kClose,  // aggregate what arrived and publish the update
};

struct RoundDecision {
  RoundAction action = RoundAction::kWait;
  std::string reason;
  bool overdue = false;  // waiting past the deadline (too few contributions): worth a warning
};

// Close when every active provider but the optional ones has contributed, or at the deadline
// when at least outer.min_providers have; otherwise wait (saying for whom). A round whose
// contributions were all refused (`refused`: their providers have left `active`) closes once
// nobody is left to wait for, without an update: waiting could not change it.
RoundDecision decide(Clock::time_point now, const RoundState& state,
                     const common::OuterConfig& config);

// A round's deadline in seconds from its start: outer.deadline_multiple × the median of the
// recent round times (ROUND_START to CONTRIBUTION) of the providers taking part, at least
// outer.deadline_min_s and at most outer.round_timeout_s; round_timeout_s before any round has
// been measured.
double round_deadline_s(std::vector<double> recent_round_s, const common::OuterConfig& config);

struct StartDecision {
  bool start = false;
  std::string reason;
};
// Whether the next round may start, from the providers that would take part in it (live, and
// for a joiner its state gone: membership.h takes_part). Round 1 waits for all
// outer.providers, or, once outer.start_grace_s have passed since the head started, for
// outer.min_providers; later rounds need outer.min_providers.
StartDecision decide_start(size_t live, const common::OuterConfig& config, bool first_round,
                           double waited_s = 0);

// How a head starts: from its run's newest checkpoint (`latest`: nullopt when there is none)
// with --resume, or with --auto-resume when there is one; from scratch when there is none; and
// never over a checkpoint it was not told to continue (kRefuse, with what to do instead).
enum class StartFrom { kScratch, kCheckpoint, kRefuse };
struct ResumeDecision {
  StartFrom from = StartFrom::kScratch;
  std::string reason;
};
ResumeDecision decide_resume(bool resume, bool auto_resume, const std::optional<std::string>& latest,
                             const std::string& run_dir);

}  // namespace xloco::outer
