// LibTorch at the codec's edge: views of named at::Tensors for the torch-free Encoder and
// Decoder. Only contiguous CPU float32 tensors are accepted; device copies and dtype casts
// belong to the caller, which knows when they are worth it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "compress/decoder.h"
#include "compress/encoder.h"
#include "compress/tensor_ref.h"

namespace xloco::compress {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Throw FrameError(kMismatch) naming the first tensor that is undefined, not on the CPU, not
// float32 or not contiguous. The views borrow the tensors' storage.
std::vector<ConstTensorRef> const_refs(const NamedTensors& tensors);
std::vector<TensorRef> refs(const NamedTensors& tensors);

void encode(Encoder& encoder, const NamedTensors& inputs, std::vector<uint8_t>& frame);
void decode(Decoder& decoder, const uint8_t* frame, size_t size, const NamedTensors& targets);
void decode_add(Decoder& decoder, const uint8_t* frame, size_t size, const NamedTensors& targets);

}  // namespace xloco::compress
