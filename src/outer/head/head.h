// The head of a DiLoCo run (design §1, §2, §8): an event loop that receives a message, asks
// the pure rules what it means (membership.h for HELLO, CONTRIBUTION and liveness, round.h for
// starting and closing rounds) and carries the verdict out: sends, member state, the model side
// (global_model.h: Δ, outer step, downlink, evaluation, checkpoints), metrics and /status. On
// SIGINT/SIGTERM, or stop(), it checkpoints before it returns.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/config.h"
#include "net/transport.h"
#include "outer/head/membership.h"
#include "outer/status/documents.h"

namespace xloco::outer {

// What the head decided, as it decides it, on the head's thread: for tests and tools that
// assert on verdicts rather than on log text. Every callback is optional.
struct HeadObserver {
  std::function<void(const std::string& peer, const Admission&)> admission;
  std::function<void(const std::string& peer, uint64_t round, const ContributionVerdict&)> contribution;
  std::function<void(const Transition&)> transition;
  std::function<void(const RoundRecord&)> round_closed;
};

struct HeadOptions {
  std::string run_dir;                // runs/NAME
  bool resume = false;                // continue from run_dir/ckpt/latest
  bool auto_resume = false;           // resume if run_dir has a checkpoint, else start the run
  std::string init;                   // warm start θ from this checkpoint (model.safetensors)
  std::string summary_file;           // where the end-of-run summary JSON goes ("" = run_dir/summary.json)
  std::string http;                   // HOST:PORT of the status endpoint ("" = none)
  std::string http_token;             // its bearer token (required beyond loopback)
  std::string baseline;               // the dashboard's baseline curve: an `xloco train` run's
                                      // metrics JSONL ("" = none)
  HeadObserver observer;
};

class Head {
 public:
  Head(const common::Config& config, HeadOptions options, std::unique_ptr<net::Transport> transport);
  ~Head();
  // Runs to the last round; returns the process exit code (0, or 130 when interrupted or
  // stopped).
  int run();
  // Thread-safe: run() checkpoints and returns 130 at its next turn, as on SIGTERM.
  void stop();
  const RunSummary& summary() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace xloco::outer
