// Shared fixtures of the core suites: a small, fast config and a scratch directory.
#pragma once

#include <cstdlib>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include <filesystem>
#include <string>

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

inline bool have_kjv() { return std::filesystem::exists("/usr/bin/bible"); }
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
  ~ScratchDir() { std::filesystem::remove_all(path); }
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

}  // namespace xloco::test
