// Child processes: spawn copies of this program with extra environment, forward SIGINT/SIGTERM
// to them, and reap them all, so that `--nproc R` and `xloco local` never leave orphans. When
// one child fails, the others are stopped (TERM, then KILL after a grace period).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace xloco::common {

struct ChildSpec {
  std::string label;                       // for log lines ("rank 1", "provider 2")
  std::vector<std::string> argv;           // argv[0] is the program path
  std::vector<std::string> env;            // "KEY=value" added to this process's environment
};

struct ChildResult {
  std::string label;
  int exit_code = 0;    // exit status, or 128 + signal
};

std::string self_exe();
pid_t spawn_child(const ChildSpec& spec);

// Installs SIGINT/SIGTERM handlers that only record the signal; wait_children forwards it.
void install_forwarding_handlers();
int pending_signal();  // 0 when none

struct WaitOptions {
  bool stop_all_on_failure = true;
  // Which children's failure stops the rest (empty: all). The others' failures are logged and
  // the rest go on, until every one of them has failed (xloco local: providers are elastic).
  std::vector<bool> critical;
  std::chrono::milliseconds grace{5000};  // after TERM, before KILL
};

// Waits for every child. On a forwarded signal or a failed child, sends SIGTERM to the rest,
// then SIGKILL after the grace period. Returns every child's result in spawn order.
std::vector<ChildResult> wait_children(const std::vector<pid_t>& pids,
                                       const std::vector<std::string>& labels,
                                       const WaitOptions& opts = {});

}  // namespace xloco::common
