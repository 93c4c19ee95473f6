#include "compress/torch_adapter.h"

#include "compress/error.h"

namespace xloco::compress {
namespace {

template <typename T>
BasicTensorRef<T> view(const std::string& name, const at::Tensor& t) {
  XLOCO_FRAME_ENFORCE(t.defined(), kMismatch, "tensor '{}' is undefined", name);
  XLOCO_FRAME_ENFORCE(t.is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(), kMismatch,
                      "tensor '{}' is {} {}{}, the codec takes contiguous CPU float", name,
                      t.device().str(), c10::toString(t.scalar_type()),
                      t.is_contiguous() ? "" : " (not contiguous)");
  const auto sizes = t.sizes();
  return BasicTensorRef<T>{name, Shape(sizes.begin(), sizes.end()), t.data_ptr<float>()};
}

}  // namespace

std::vector<ConstTensorRef> const_refs(const NamedTensors& tensors) {
  std::vector<ConstTensorRef> out;
  out.reserve(tensors.size());
  for (const auto& [name, t] : tensors) out.push_back(view<const float>(name, t));
  return out;
}

std::vector<TensorRef> refs(const NamedTensors& tensors) {
  std::vector<TensorRef> out;
  out.reserve(tensors.size());
  for (const auto& [name, t] : tensors) out.push_back(view<float>(name, t));
  return out;
}

void encode(Encoder& encoder, const NamedTensors& inputs, std::vector<uint8_t>& frame) {
  encoder.encode(const_refs(inputs), frame);
}

void decode(Decoder& decoder, const uint8_t* frame, size_t size, const NamedTensors& targets) {
  decoder.decode(frame, size, refs(targets));
}

void decode_add(Decoder& decoder, const uint8_t* frame, size_t size, const NamedTensors& targets) {
  decoder.decode_add(frame, size, refs(targets));
}

}  // namespace xloco::compress
