#include "compress/torch_adapter.h"

#include "compress/error.h"

namespace xloco::compress {
namespace {

template <typename T>
std::vector<BasicTensorRef<T>> views(const common::FlatLayout& layout, const at::Tensor& flat) {
  XLOCO_FRAME_ENFORCE(flat.defined(), kMismatch, "the flat parameter buffer is undefined");
  XLOCO_FRAME_ENFORCE(flat.is_cpu() && flat.scalar_type() == at::kFloat && flat.is_contiguous(),
                      kMismatch, "the flat buffer is {} {}{}, the codec takes contiguous CPU float",
                      flat.device().str(), c10::toString(flat.scalar_type()),
                      flat.is_contiguous() ? "" : " (not contiguous)");
  XLOCO_FRAME_ENFORCE(flat.numel() == layout.numel, kMismatch,
                      "the flat buffer has {} elements, its layout {}", flat.numel(), layout.numel);
  T* base = flat.data_ptr<float>();
  std::vector<BasicTensorRef<T>> out;
  out.reserve(layout.slots.size());
  for (const auto& s : layout.slots) out.push_back({s.name, s.shape, base + s.offset});
  return out;
}

}  // namespace

std::vector<ConstTensorRef> const_refs(const common::FlatLayout& layout, const at::Tensor& flat) {
  return views<const float>(layout, flat);
}

std::vector<TensorRef> refs(const common::FlatLayout& layout, at::Tensor& flat) {
  return views<float>(layout, flat);
}

void encode(Encoder& encoder, const common::FlatLayout& layout, const at::Tensor& flat,
            std::vector<uint8_t>& frame) {
  encoder.encode(const_refs(layout, flat), frame);
}

void decode(Decoder& decoder, const uint8_t* frame, size_t size, const common::FlatLayout& layout,
            at::Tensor& flat) {
  decoder.decode(frame, size, refs(layout, flat));
}

void decode_add(Decoder& decoder, const uint8_t* frame, size_t size,
                const common::FlatLayout& layout, at::Tensor& flat) {
  decoder.decode_add(frame, size, refs(layout, flat));
}

}  // namespace xloco::compress
