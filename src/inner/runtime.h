// Process-wide runtime settings for a training rank: the torch device from config (`auto` =
// CUDA when present) and the thread counts (LibTorch intra-op × OpenBLAS), chosen by
// measurement (experiments/RESULTS.md): oversubscribing the cores halves throughput.
#pragma once

#include <string>

#include <torch/types.h>

#include "common/config.h"

namespace xloco::inner {

torch::Device resolve_device(const std::string& device);

struct ThreadPlan {
  int intra_op = 1;
  int blas = 1;
};
// threads = 0 means 1 intra-op thread; blas_threads = 0 the host's cores divided among the ranks
// that share it.
ThreadPlan configure_threads(const common::RunConfig& run, int ranks_on_host);

}  // namespace xloco::inner
