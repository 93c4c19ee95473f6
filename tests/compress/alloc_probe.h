// The compress test binary replaces global operator new to record the largest single
// allocation, so that tests can show a hostile size was refused before anything was allocated
// for it. (zstd allocates its fixed-size contexts with malloc, which is not counted.)
#pragma once

#include <cstddef>

namespace xloco::compress::testing {

void reset_largest_allocation();
size_t largest_allocation();

}  // namespace xloco::compress::testing
