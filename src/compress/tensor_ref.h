// A named view of a contiguous fp32 buffer that the caller owns. The codec core works on these
// so that it builds without LibTorch; torch_adapter.h makes them from at::Tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace xloco::compress {

using Shape = std::vector<int64_t>;

template <typename T>
struct BasicTensorRef {
  std::string name;
  Shape shape;
  T* data = nullptr;  // shape's product contiguous floats; may be null when that is 0

  // Throws FrameError(kMismatch) on a negative dimension or an overflowing product.
  uint64_t numel() const;
};

using TensorRef = BasicTensorRef<float>;             // a decode target
using ConstTensorRef = BasicTensorRef<const float>;  // an encode input

// Product of dims, or throws FrameError(kMismatch) naming `name` on a negative dim or overflow.
uint64_t checked_numel(const Shape& shape, const std::string& name);

template <typename T>
uint64_t BasicTensorRef<T>::numel() const {
  return checked_numel(shape, name);
}

}  // namespace xloco::compress
