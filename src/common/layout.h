// Where each named parameter lives in one flat fp32 buffer. The trainer builds it (every module
// parameter is a view into the flat buffer), the head and the providers cut their θ, θ_pub and
// Δ buffers by it, and the codec adapter (compress/torch_adapter.h) turns it into the named
// views a frame carries. It knows no tensor type: offsets and shapes only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace xloco::common {

struct ParamSlot {
  std::string name;            // nanoGPT-style parameter name
  std::vector<int64_t> shape;
  int64_t offset = 0;          // first element in the flat buffer
  int64_t numel = 0;
};

struct FlatLayout {
  std::vector<ParamSlot> slots;  // in buffer order, without gaps
  int64_t numel = 0;             // elements of the whole buffer
  // Where the model's float buffers start (e.g. batch-norm statistics of a TorchScript model):
  // they ride in θ after every trained parameter, untouched by AdamW, and the outer step sets
  // them to the providers' average instead of stepping along them. numel when there are none.
  int64_t buffers_offset = -1;
  int64_t trained_numel() const { return buffers_offset < 0 ? numel : buffers_offset; }

  // Places a parameter right after the last one.
  const ParamSlot& append(const std::string& name, const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (const int64_t d : shape) n *= d;
    slots.push_back({name, shape, numel, n});
    numel += n;
    return slots.back();
  }
  int64_t bytes() const { return numel * static_cast<int64_t>(sizeof(float)); }
  // The parameter holding flat element `index` (0 ≤ index < numel).
  const ParamSlot& slot_at(int64_t index) const {
    size_t lo = 0, hi = slots.size();  // the last slot whose offset is ≤ index
    while (hi - lo > 1) {
      const size_t mid = (lo + hi) / 2;
      (slots[mid].offset <= index ? lo : hi) = mid;
    }
    return slots[lo];
  }
};

}  // namespace xloco::common
