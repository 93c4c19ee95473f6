// Shared fixtures of the core suites: a small, fast config and a scratch directory.
#pragma once

#include <csignal>
#include <cstdlib>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/config.h"

namespace xloco::test {

inline common::Config tiny_gpt_config() {
  common::Config c;
  c.model.d_model = 64;
  c.model.n_layer = 2;
  c.model.n_head = 4;
  c.model.seq_len = 64;
  c.inner.batch_size = 8;
  c.inner.steps = 100;
  c.inner.warmup_steps = 5;
  c.inner.lr = 2e-3;
  c.inner.eval_batches = 2;
  c.run.threads = 1;
  return c;
}

// XLOCO_TEST_PRETEND_MISSING=kjv: as if bible-kjv were not installed (tests/CMakeLists.txt
// checks that the cases needing it are then reported skipped).
inline bool have_kjv() {
  const char* missing = std::getenv("XLOCO_TEST_PRETEND_MISSING");
  if (missing != nullptr && std::string(missing).find("kjv") != std::string::npos) return false;
  return std::filesystem::exists("/usr/bin/bible");
}

// A case that cannot run here (its input is missing, or it needs root): it says why and is
// counted, and a run of the test binary in which any case was skipped and none failed exits
// with 77, which ctest reports as skipped (SKIP_RETURN_CODE), never as a silent pass.
inline std::atomic<int>& skipped_cases() {
  static std::atomic<int> n{0};
  return n;
}
#define XLOCO_SKIP_CASE(why)                 \
  do {                                       \
    MESSAGE("skipped: " << (why));           \
    ++::xloco::test::skipped_cases();        \
    return;                                  \
  } while (false)
inline bool have_fmnist() {
  return std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
}

// A fresh directory under the build tree's temp area, removed at scope exit.
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& tag) {
    path = std::filesystem::temp_directory_path() /
           ("xloco-test-" + tag + "-" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    if (std::getenv("XLOCO_KEEP_TEST_DIRS") == nullptr) std::filesystem::remove_all(path);
  }
  std::string str() const { return path.string(); }
};

inline std::string env_or(const char* key, const std::string& fallback) {
  const char* v = std::getenv(key);
  return v ? v : fallback;
}

struct RunResult {
  int code = 0;         // exit status, or 128 + signal
  std::string out;      // stdout and stderr
};

// Runs the real `xloco` binary (XLOCO_BIN, set by ctest) with `args`.
inline RunResult run_xloco(const std::string& args) {
  const std::string cmd = env_or("XLOCO_BIN", "xloco") + " " + args + " 2>&1";
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {127, "popen failed: " + cmd};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

// ---------------------------------------------------------------- processes of a real run

inline std::vector<nlohmann::json> jsonl(const std::filesystem::path& p) {
  std::vector<nlohmann::json> out;
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Starts `xloco ARGS` in its own process group with output to `log`; returns its pid (-1 when
// fork fails).
inline pid_t start_group(const std::string& args, const std::string& log) {
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    setpgid(0, 0);
    // Dies with the test process, even one killed without unwinding (SIGKILL, SIGPIPE).
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const std::string cmd = "exec " + env_or("XLOCO_BIN", "xloco") + " " + args + " > " + log + " 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(pid, pid);
  return pid;
}

// A process group a test started (start_group): SIGKILLed and reaped when the test leaves its
// scope, pass or fail, unless the test reaped it already.
struct GroupGuard {
  pid_t pid = -1;
  explicit GroupGuard(pid_t p) : pid(p) {}
  ~GroupGuard() {
    if (pid <= 0) return;
    ::kill(-pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  // Waits for the group's leader and takes its status; the guard then has nothing left to do.
  int wait() {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::kill(-pid, SIGKILL);  // anything it left behind in its group
    pid = -1;
    return status;
  }
  GroupGuard(const GroupGuard&) = delete;
  GroupGuard& operator=(const GroupGuard&) = delete;
};

// Rounds a provider trained before the head started them (outer.overlap = delayed), from its
// metrics file.
inline size_t chained_rounds(const std::filesystem::path& provider_metrics) {
  size_t n = 0;
  for (const auto& r : jsonl(provider_metrics)) n += r.contains("chained") && r["chained"].get<bool>();
  return n;
}

// Waits (up to 3 minutes) until head.jsonl has n rounds; false if `pid` exits first.
inline bool wait_rounds(const std::filesystem::path& head_jsonl, size_t n, pid_t pid) {
  for (int i = 0; i < 1800; ++i) {
    if (std::filesystem::exists(head_jsonl) && jsonl(head_jsonl).size() >= n) return true;
    if (waitpid(pid, nullptr, WNOHANG) != 0) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// Waits (up to `seconds`) until the file contains `needle`.
inline bool wait_for_text(const std::string& path, const std::string& needle, double seconds = 120) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (slurp(path).find(needle) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// The pid of a process whose command line contains `needle` (not this one), or -1; with
// `group` > 0, only among the members of that process group, which a test started itself.
// Tests signal only what this finds in their own groups; a search of the whole machine is
// for checking that nothing escaped, never for choosing what to signal.
inline pid_t find_process(const std::string& needle, pid_t group = 0) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const auto name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = std::stoi(name);
    if (pid == ::getpid() || (group > 0 && ::getpgid(pid) != group)) continue;
    std::ifstream in(e.path() / "cmdline");
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find(needle) != std::string::npos) return pid;
  }
  return -1;
}

// A TCP port that was free a moment ago (for a head that must come back on the same port).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace xloco::test
