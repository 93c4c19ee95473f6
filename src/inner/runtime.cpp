#include "inner/runtime.h"

#include <dlfcn.h>

#include <algorithm>
#include <thread>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "common/error.h"

namespace xloco::inner {

torch::Device resolve_device(const std::string& device, int rank) {
  const int gpus = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  if (device == "auto" || device == "cuda") {
    XLOCO_ENFORCE(device == "auto" || gpus > 0, common::ConfigError,
                  "run.device = cuda but this LibTorch ({}) sees no CUDA device", torch_summary());
    if (gpus == 0) return torch::Device(torch::kCPU);
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(rank % gpus));
  }
  try {
    torch::Device d(device);
    XLOCO_ENFORCE(!d.is_cuda() || (gpus > 0 && d.index() < gpus), common::ConfigError,
                  "run.device = {} but this LibTorch ({}) sees {} CUDA device(s)", device,
                  torch_summary(), gpus);
    return d;
  } catch (const c10::Error&) {
    throw common::ConfigError(
        fmt::format("run.device = \"{}\" is not a device; allowed: auto, cpu, cuda, cuda:N", device));
  }
}

std::string torch_summary() {
  std::string s = fmt::format("LibTorch {}", TORCH_VERSION);
  if (!torch::cuda::is_available()) return s + ", CPU";
  s += fmt::format(", CUDA ({} GPU{})", torch::cuda::device_count(),
                   torch::cuda::device_count() == 1 ? "" : "s");
#ifdef USE_C10D_NCCL
  s += ", NCCL";
#endif
  return s;
}

// LibTorch 2.x takes the device type in autocast's setters; 1.13 has one setter per device.
Autocast::Autocast(common::Precision precision, torch::Device device)
    : on_(precision == common::Precision::kBf16), cuda_(device.is_cuda()) {
  if (!on_) return;
#if TORCH_VERSION_MAJOR >= 2
  const auto type = cuda_ ? at::kCUDA : at::kCPU;
  at::autocast::set_autocast_dtype(type, at::kBFloat16);
  at::autocast::set_autocast_enabled(type, true);
#else
  if (cuda_) {
    at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
    at::autocast::set_enabled(true);
  } else {
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::set_cpu_enabled(true);
  }
#endif
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  if (!on_) return;
  // The bf16 copies of the weights cached for this forward go with it (the weights move).
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if TORCH_VERSION_MAJOR >= 2
  at::autocast::set_autocast_enabled(cuda_ ? at::kCUDA : at::kCPU, false);
#else
  if (cuda_) {
    at::autocast::set_enabled(false);
  } else {
    at::autocast::set_cpu_enabled(false);
  }
#endif
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
