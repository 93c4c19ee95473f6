// LibTorch at the codec's edge: a flat fp32 at::Tensor cut by a common::FlatLayout into the
// named views the torch-free Encoder and Decoder take. Only a contiguous CPU float32 buffer of
// the layout's size is accepted; device copies and dtype casts belong to the caller, which
// knows when they are worth it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "common/layout.h"
#include "compress/decoder.h"
#include "compress/encoder.h"
#include "compress/tensor_ref.h"

namespace xloco::compress {

// Throw FrameError(kMismatch) when `flat` is undefined, not on the CPU, not float32, not
// contiguous, or not layout.numel elements. The views borrow its storage.
std::vector<ConstTensorRef> const_refs(const common::FlatLayout& layout, const at::Tensor& flat);
std::vector<TensorRef> refs(const common::FlatLayout& layout, at::Tensor& flat);

void encode(Encoder& encoder, const common::FlatLayout& layout, const at::Tensor& flat,
            std::vector<uint8_t>& frame);
void decode(Decoder& decoder, const uint8_t* frame, size_t size, const common::FlatLayout& layout,
            at::Tensor& flat);
void decode_add(Decoder& decoder, const uint8_t* frame, size_t size,
                const common::FlatLayout& layout, at::Tensor& flat);

// f(i, x) for each value x a frame carries over `layout`'s tensors (those of `span`), i its
// element in the layout's flat buffer, in table and block order; then done(begin, end) after
// each block with its flat range (every block, one with nothing sent included). x is the float
// decode() writes there. Sparse for topk: unsent elements are never visited
// (Decoder::for_each_block, which makes the checks; targets give names and shapes).
template <class F, class Done>
void for_each_value(Decoder& decoder, const uint8_t* frame, size_t size,
                    const common::FlatLayout& layout, const std::vector<TensorRef>& targets,
                    F&& f, Done&& done, TensorSpan span = {}) {
  decoder.for_each_block(
      frame, size, targets,
      [&](size_t t, const BlockValues& b) {
        const int64_t at = layout.slots[t].offset + static_cast<int64_t>(b.start);
        for (uint32_t j = 0; j < b.n; ++j) f(at + (b.pos != nullptr ? b.pos[j] : j), b.value[j]);
        done(at, at + b.len);
      },
      span);
}

}  // namespace xloco::compress
