// The process-wide allocator policy (glibc malloc), set in one place: each command of the CLI
// chooses the policy of its role once, at start, and library code only asks for a scoped change
// or for free memory to be handed back. Figures behind each choice are in experiments/RESULTS.md.
#pragma once

namespace xloco::common {

enum class AllocPolicy {
  // Training ranks: LibTorch frees and re-allocates the same activation-sized buffers every
  // step; served by mmap, every step page-faults them back in (14 % of a tiny-GPT step), so
  // they stay in the heap and freed heap memory stays resident.
  kTrainer,
  // The head: its large transients (codec frames, received contributions, codec buffers) are
  // mmapped and returned on free instead of fragmenting a heap that never shrinks (issue 5:
  // head peak RSS 5.1x -> 4.8x of the parameter bytes). Its evaluation, on a thread of its
  // own beside the rounds, runs under it too: a policy is process-wide.
  kHead,
};

void set_alloc_policy(AllocPolicy policy);

// Gives freed heap memory back to the system (malloc_trim): after a one-off model-sized free.
void release_free_memory();

}  // namespace xloco::common
