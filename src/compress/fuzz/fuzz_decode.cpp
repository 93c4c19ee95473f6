// Feeds arbitrary bytes to the decoder. A frame may be refused only with FrameError; a frame
// that is accepted must decode (and decode-add) into targets shaped by its own table, and
// plain decoding must leave only finite values.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "compress/decoder.h"
#include "compress/error.h"
#include "fuzz_limits.h"

using namespace xloco::compress;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Decoder decoder(fuzz::fuzz_limits());
  FrameInfo info;
  try {
    info = decoder.inspect(data, size);
  } catch (const FrameError&) {
    return 0;
  }
  std::vector<std::vector<float>> buffers;
  std::vector<TensorRef> targets;
  buffers.reserve(info.tensors.size());
  for (const TensorEntry& e : info.tensors) {
    buffers.emplace_back(e.numel, 1.0f);
    targets.push_back({e.name, e.shape, buffers.back().data()});
  }
  try {
    decoder.decode(data, size, targets);
  } catch (const FrameError&) {
    return 0;
  }
  for (const auto& b : buffers) {
    for (const float v : b) {
      if (!std::isfinite(v)) std::abort();
    }
  }
  // The same frame was just accepted, so adding it must not be refused.
  decoder.decode_add(data, size, targets);
  return 0;
}
