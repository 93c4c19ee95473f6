// Limits for the fuzz targets: small enough that a frame the fuzzer invents can make the
// decoder allocate at most a few MiB, large enough for every seed frame.
#pragma once

#include "compress/codec.h"

namespace xloco::compress::fuzz {

inline Limits fuzz_limits() {
  Limits l;
  l.max_tensors = 64;
  l.max_tensor_elements = 1 << 18;
  l.max_payload_bytes = 1 << 20;
  l.max_name_bytes = 64;
  return l;
}

}  // namespace xloco::compress::fuzz
