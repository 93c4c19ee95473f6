// The head of a DiLoCo run (design §1, §2, §8): holds θ_true, θ_pub and the outer momentum,
// admits providers (HELLO → WELCOME with the full θ_pub and a data shard), runs the rounds
// (ROUND_START → CONTRIBUTION from each → UPDATE), evaluates θ_pub, writes metrics and atomic
// checkpoints, and on SIGINT/SIGTERM checkpoints before it exits. Decisions come from round.h.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "common/config.h"
#include "net/transport.h"

namespace xloco::outer {

struct HeadOptions {
  std::string run_dir;                // runs/NAME
  bool resume = false;                // continue from run_dir/ckpt/latest
  bool auto_resume = false;           // resume if run_dir has a checkpoint, else start the run
  std::string init;                   // warm start θ from this checkpoint (model.safetensors)
  std::string summary_file;           // where the end-of-run summary JSON goes ("" = run_dir/summary.json)
  std::string http;                   // HOST:PORT of the status endpoint ("" = none)
};

struct HeadSummary {
  int rounds = 0;
  double final_eval_loss = 0;
  double bytes_up = 0, bytes_down = 0;
  double fp32_dp_bytes = 0;  // what per-step fp32 data parallel would have sent, same steps
  double wall_s = 0;
  std::string param_hash;
};

class Head {
 public:
  Head(const common::Config& config, HeadOptions options, std::unique_ptr<net::Transport> transport);
  ~Head();
  // Runs to the last round; returns the process exit code (0, or 130 when interrupted).
  int run();
  const HeadSummary& summary() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace xloco::outer
