#include "common/alloc.h"

#include <malloc.h>

#include <atomic>

namespace xloco::common {
namespace {

// glibc's defaults until a command sets a policy (tests, tools).
std::atomic<AllocPolicy> g_policy{AllocPolicy::kTrainer};
std::atomic<bool> g_set{false};

}  // namespace

void set_alloc_policy(AllocPolicy policy) {
  switch (policy) {
    case AllocPolicy::kTrainer:
      mallopt(M_MMAP_THRESHOLD, 32 << 20);
      mallopt(M_TRIM_THRESHOLD, 1 << 30);
      break;
    case AllocPolicy::kHead:
      mallopt(M_MMAP_THRESHOLD, 1 << 20);
      mallopt(M_TRIM_THRESHOLD, 8 << 20);
      break;
    case AllocPolicy::kEvaluating:
      mallopt(M_MMAP_THRESHOLD, 32 << 20);
      break;
  }
  g_policy = policy;
  g_set = true;
}

AllocPolicy alloc_policy() { return g_policy; }

void release_free_memory() { malloc_trim(0); }

ScopedAllocPolicy::ScopedAllocPolicy(AllocPolicy policy) : previous_(g_policy) {
  // A process whose command set no policy keeps glibc's defaults: nothing to switch.
  if (g_set) set_alloc_policy(policy);
}

ScopedAllocPolicy::~ScopedAllocPolicy() {
  if (!g_set) return;
  set_alloc_policy(previous_);
  release_free_memory();
}

}  // namespace xloco::common
