#include "inner/runtime.h"

#include <dlfcn.h>

#include <algorithm>
#include <thread>

#include <torch/torch.h>

#include "common/error.h"

namespace xloco::inner {

torch::Device resolve_device(const std::string& device) {
  if (device == "auto") return torch::cuda::is_available() ? torch::Device(torch::kCUDA)
                                                           : torch::Device(torch::kCPU);
  try {
    torch::Device d(device);
    XLOCO_ENFORCE(!d.is_cuda() || torch::cuda::is_available(), common::ConfigError,
                  "run.device = {} but this LibTorch sees no CUDA device", device);
    return d;
  } catch (const c10::Error&) {
    throw common::ConfigError(
        fmt::format("run.device = \"{}\" is not a device; allowed: auto, cpu, cuda, cuda:N", device));
  }
}

ThreadPlan configure_threads(const common::RunConfig& run, int ranks_on_host) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ThreadPlan plan;
  // Measured on the tiny GPT (experiments/RESULTS.md): one intra-op thread and the rank's share
  // of the cores for OpenBLAS is fastest; both at the core count oversubscribes and halves it.
  const int share = std::max(1, cores / std::max(1, ranks_on_host));
  plan.intra_op = run.threads > 0 ? run.threads : 1;
  plan.blas = run.blas_threads > 0 ? run.blas_threads : share;
  at::set_num_threads(plan.intra_op);
  // OpenBLAS keeps its own pool; LibTorch's BLAS calls run inside intra-op threads already.
  // Looked up at run time: a LibTorch built on MKL (CUDA wheels) has no OpenBLAS.
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    fn(plan.blas);
  }
  return plan;
}

}  // namespace xloco::inner
