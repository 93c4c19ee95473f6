#include "common/process.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include <spdlog/spdlog.h>

#include "common/error.h"

extern char** environ;

namespace xloco::common {
namespace {

std::atomic<int> g_signal{0};

void on_signal(int sig) { g_signal.store(sig); }

int decode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  XLOCO_ENFORCE(n > 0, Error, "cannot read /proc/self/exe: {}", std::strerror(errno));
  return std::string(buf, static_cast<size_t>(n));
}

pid_t spawn_child(const ChildSpec& spec) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  for (const auto& add : spec.env) {
    const std::string key = add.substr(0, add.find('=') + 1);
    env_strings.erase(std::remove_if(env_strings.begin(), env_strings.end(),
                                     [&](const std::string& s) { return s.rfind(key, 0) == 0; }),
                      env_strings.end());
    env_strings.push_back(add);
  }
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = spec.argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), envp.data());
  XLOCO_ENFORCE(rc == 0, Error, "cannot start {} ({}): {}", spec.label, spec.argv[0],
                std::strerror(rc));
  return pid;
}

void install_forwarding_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

int pending_signal() { return g_signal.load(); }

std::vector<ChildResult> wait_children(const std::vector<pid_t>& pids,
                                       const std::vector<std::string>& labels,
                                       const WaitOptions& opts) {
  std::vector<ChildResult> results(pids.size());
  std::vector<bool> done(pids.size(), false);
  size_t remaining = pids.size();
  bool stopping = false;
  std::chrono::steady_clock::time_point kill_at{};
  auto stop_all = [&](int sig) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (!done[i]) ::kill(pids[i], sig);
    }
  };
  int forwarded = 0;
  while (remaining > 0) {
    const int sig = g_signal.load();
    if (sig != 0 && sig != forwarded) {
      forwarded = sig;
      spdlog::warn("received signal {}, stopping {} child process(es)", sig, remaining);
      stop_all(sig);
      stopping = true;
      kill_at = std::chrono::steady_clock::now() + opts.grace;
    }
    if (stopping && std::chrono::steady_clock::now() >= kill_at) {
      spdlog::warn("{} child process(es) still running after {} ms, killing", remaining,
                   opts.grace.count());
      stop_all(SIGKILL);
      kill_at = std::chrono::steady_clock::now() + std::chrono::hours(1);
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    for (size_t i = 0; i < pids.size(); ++i) {
      if (pids[i] != pid || done[i]) continue;
      done[i] = true;
      --remaining;
      results[i] = {labels[i], decode_status(status)};
      const bool critical = opts.critical.empty() || (i < opts.critical.size() && opts.critical[i]);
      if (results[i].exit_code != 0 && !stopping && opts.stop_all_on_failure && !critical) {
        size_t expendable = 0, failed = 0;
        for (size_t k = 0; k < pids.size(); ++k) {
          if (k < opts.critical.size() && opts.critical[k]) continue;
          ++expendable;
          failed += done[k] && results[k].exit_code != 0 ? 1 : 0;
        }
        if (failed < expendable) {
          spdlog::warn("{} exited with code {}; the run goes on without it", labels[i],
                       results[i].exit_code);
          continue;
        }
      }
      if (results[i].exit_code != 0 && !stopping && opts.stop_all_on_failure) {
        if (results[i].exit_code == 130) {
          spdlog::warn("{} was interrupted; stopping the others", labels[i]);
        } else {
          spdlog::error("{} exited with code {}; stopping the others", labels[i],
                        results[i].exit_code);
        }
        stop_all(SIGTERM);
        stopping = true;
        kill_at = std::chrono::steady_clock::now() + opts.grace;
      }
    }
  }
  return results;
}

}  // namespace xloco::common
