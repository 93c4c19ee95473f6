// Process-wide runtime settings for a training rank: the torch device from config (`auto` =
// CUDA when present), the thread counts (LibTorch intra-op × OpenBLAS), chosen by measurement
// (experiments/RESULTS.md): oversubscribing the cores halves throughput, and run.precision's
// autocast. LibTorch 1.13 and 2.x differ here (autocast's API): runtime.cpp hides which.
#pragma once

#include <string>

#include <torch/types.h>

#include "common/config.h"

namespace xloco::inner {

// `auto`: CUDA when this LibTorch sees a GPU, else the CPU; `auto` and `cuda` give rank r of a
// provider GPU r mod (GPUs on the host), so that each rank of `--nproc N` has its own.
torch::Device resolve_device(const std::string& device, int rank = 0);

// LibTorch's version and what it can do here: "LibTorch 2.11.0, CUDA 13.0 (1 GPU), NCCL".
std::string torch_summary();

// run.precision = bf16: LibTorch's autocast on `device` (bf16 products, fp32 reductions and
// weights) for the life of the guard; fp32: nothing. Not nestable across devices.
class Autocast {
 public:
  Autocast(common::Precision precision, torch::Device device);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool on_ = false;
  bool cuda_ = false;
};

struct ThreadPlan {
  int intra_op = 1;
  int blas = 1;
};
// threads = 0 means 1 intra-op thread; blas_threads = 0 the host's cores divided among the ranks
// that share it.
ThreadPlan configure_threads(const common::RunConfig& run, int ranks_on_host);

}  // namespace xloco::inner
