#include "common/alloc.h"

#include <malloc.h>

namespace xloco::common {

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
  }
}

void release_free_memory() { malloc_trim(0); }

}  // namespace xloco::common
