#include "inner/blas_core.h"

#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace xloco::inner {

SimdLevel CpuSimd::level() const {
  if (avx512f && avx512bw && avx512dq && avx512vl) return SimdLevel::kAvx512;
  if (avx2 && fma) return SimdLevel::kAvx2;
  if (avx) return SimdLevel::kAvx;
  return SimdLevel::kSse;
}

CpuSimd detect_cpu_simd() {
  CpuSimd c;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  c.avx = __builtin_cpu_supports("avx");
  c.avx2 = __builtin_cpu_supports("avx2");
  c.fma = __builtin_cpu_supports("fma");
  c.avx512f = __builtin_cpu_supports("avx512f");
  c.avx512bw = __builtin_cpu_supports("avx512bw");
  c.avx512dq = __builtin_cpu_supports("avx512dq");
  c.avx512vl = __builtin_cpu_supports("avx512vl");
#endif
  return c;
}

namespace {

struct CoreLevel {
  const char* name;
  SimdLevel level;
};
// OpenBLAS's x86-64 core names (driver/others/dynamic.c), by the widest vectors their sgemm uses.
constexpr std::array<CoreLevel, 28> kCores{{
    {"Katmai", SimdLevel::kSse},     {"Coppermine", SimdLevel::kSse}, {"Northwood", SimdLevel::kSse},
    {"Prescott", SimdLevel::kSse},   {"Banias", SimdLevel::kSse},     {"Atom", SimdLevel::kSse},
    {"Core2", SimdLevel::kSse},      {"Penryn", SimdLevel::kSse},     {"Dunnington", SimdLevel::kSse},
    {"Nehalem", SimdLevel::kSse},    {"Athlon", SimdLevel::kSse},     {"Opteron", SimdLevel::kSse},
    {"Opteron_SSE3", SimdLevel::kSse}, {"Barcelona", SimdLevel::kSse}, {"Nano", SimdLevel::kSse},
    {"Bobcat", SimdLevel::kSse},     {"Sandybridge", SimdLevel::kAvx}, {"Bulldozer", SimdLevel::kAvx},
    {"Piledriver", SimdLevel::kAvx}, {"Steamroller", SimdLevel::kAvx}, {"Excavator", SimdLevel::kAvx2},
    {"Haswell", SimdLevel::kAvx2},   {"Zen", SimdLevel::kAvx2},       {"SkylakeX", SimdLevel::kAvx512},
    {"Cooperlake", SimdLevel::kAvx512}, {"SapphireRapids", SimdLevel::kAvx512},
    {"Generic", SimdLevel::kSse},    {"Unknown", SimdLevel::kSse},
}};

const char* best_core_for(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512: return "SkylakeX";
    case SimdLevel::kAvx2: return "Haswell";
    case SimdLevel::kAvx: return "Sandybridge";
    default: return nullptr;
  }
}

const char* level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512: return "AVX-512";
    case SimdLevel::kAvx2: return "AVX2+FMA";
    case SimdLevel::kAvx: return "AVX";
    case SimdLevel::kSse: return "SSE";
    default: return "unknown";
  }
}

}  // namespace

SimdLevel openblas_core_level(std::string_view core) {
  for (const auto& c : kCores) {
    if (core.size() == std::strlen(c.name) && strncasecmp(core.data(), c.name, core.size()) == 0) {
      return c.level;
    }
  }
  return SimdLevel::kUnknown;
}

BlasCoreVerdict choose_blas_core(const CpuSimd& cpu, std::string_view detected,
                                 const char* env_coretype) {
  if (env_coretype != nullptr) {
    return {"", fmt::format("OPENBLAS_CORETYPE={} was set in the environment", env_coretype)};
  }
  if (detected.empty()) return {"", "the BLAS is not OpenBLAS; nothing to choose"};
  const SimdLevel have = openblas_core_level(detected);
  if (have == SimdLevel::kUnknown) {
    return {"", fmt::format("OpenBLAS chose {}, a core this table does not know; kept", detected)};
  }
  const SimdLevel cpu_level = cpu.level();
  const char* best = best_core_for(cpu_level);
  if (best == nullptr || have >= cpu_level) {
    return {"", fmt::format("OpenBLAS chose {}, which uses this CPU's widest vectors ({})",
                            detected, level_name(cpu_level))};
  }
  return {best, fmt::format("OpenBLAS detected {} ({} kernels) on a CPU with {}; its model number "
                            "is newer than this OpenBLAS, so xloco runs OpenBLAS's {} kernels "
                            "(set OPENBLAS_CORETYPE to choose another)",
                            detected, level_name(have), level_name(cpu_level), best)};
}

std::string openblas_core_name() {
  using CoreName = char* (*)();
  auto fn = reinterpret_cast<CoreName>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (fn == nullptr) return "";
  const char* name = fn();
  return name != nullptr ? std::string(name) : std::string();
}

bool command_uses_blas(const char* command) {
  static constexpr std::array<const char*, 6> kComputing{"train", "worker", "head", "local", "eval",
                                                         "sample"};
  for (const char* c : kComputing) {
    if (std::strcmp(command, c) == 0) return true;
  }
  return false;
}

std::string reexec_with_blas_core(char** argv) {
  const auto verdict = choose_blas_core(detect_cpu_simd(), openblas_core_name(),
                                        std::getenv("OPENBLAS_CORETYPE"));
  if (verdict.core.empty()) return "";
  ::setenv("OPENBLAS_CORETYPE", verdict.core.c_str(), 1);
  ::setenv("XLOCO_BLAS_CORE_REASON", verdict.reason.c_str(), 1);
  ::execv("/proc/self/exe", argv);
  return fmt::format("could not re-execute with OPENBLAS_CORETYPE={} ({}); running on {}",
                     verdict.core, std::strerror(errno), openblas_core_name());
}

std::string blas_core_summary() {
  const std::string core = openblas_core_name();
  if (core.empty()) return "BLAS: not OpenBLAS";
  if (const char* why = std::getenv("XLOCO_BLAS_CORE_REASON")) {
    return fmt::format("OpenBLAS core {}: {}", core, why);
  }
  const auto v = choose_blas_core(detect_cpu_simd(), core, std::getenv("OPENBLAS_CORETYPE"));
  return fmt::format("OpenBLAS core {}: {}", core, v.reason);
}

}  // namespace xloco::inner
