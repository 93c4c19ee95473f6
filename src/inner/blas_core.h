// Which OpenBLAS kernel set ("core") the inner step runs on. OpenBLAS built with DYNAMIC_ARCH
// (Debian's) picks its kernels from the CPU's family/model number, and a release older than the
// CPU falls back to its most generic set: on an Emerald Rapids VM (family 6, model 207) OpenBLAS
// 0.3.21 runs Prescott's SSE3 sgemm at 22–25 GFLOP/s per core where its SkylakeX kernels reach
// ~100 (experiments/RESULTS.md, issue 18). The choice is made from the instruction sets the CPU
// reports, and only when the detected core is below them; the kernel set can only be chosen
// before OpenBLAS loads, so `xloco` re-executes itself with OPENBLAS_CORETYPE set (main.cpp).
// No LibTorch here: main.cpp includes this before anything heavy.
#pragma once

#include <string>
#include <string_view>

namespace xloco::inner {

// Instruction-set levels, ordered.
enum class SimdLevel { kUnknown = 0, kSse = 1, kAvx = 2, kAvx2 = 3, kAvx512 = 4 };

struct CpuSimd {
  bool avx = false, avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false;
  SimdLevel level() const;
};

// This CPU's (cpuid, and the OS saves its registers).
CpuSimd detect_cpu_simd();

// The level an OpenBLAS core name's kernels use; kUnknown for a name not in the table.
SimdLevel openblas_core_level(std::string_view core);

struct BlasCoreVerdict {
  std::string core;    // OPENBLAS_CORETYPE to run with; empty = keep what OpenBLAS chose
  std::string reason;  // always set: why
};

// The decision (pure): `detected` is openblas_get_corename() ("" when the BLAS is not OpenBLAS),
// `env_coretype` OPENBLAS_CORETYPE's value (nullptr when unset: a value set by the user wins).
BlasCoreVerdict choose_blas_core(const CpuSimd& cpu, std::string_view detected,
                                 const char* env_coretype);

// What OpenBLAS in this process runs ("" when it is not OpenBLAS, e.g. MKL builds of LibTorch).
std::string openblas_core_name();

// For main(): when the verdict changes the core, set OPENBLAS_CORETYPE and XLOCO_BLAS_CORE_REASON
// and re-execute /proc/self/exe with the same arguments. Returns only when nothing is to be done
// ("") or exec failed (what went wrong, for the caller to print).
std::string reexec_with_blas_core(char** argv);

// Whether an `xloco` sub-command computes with BLAS (train, worker, head, local, eval, sample):
// only those pay the ~0.5 s of a second start.
bool command_uses_blas(const char* command);

// One line for the trainer's start-up log: the core in use and why.
std::string blas_core_summary();

}  // namespace xloco::inner
