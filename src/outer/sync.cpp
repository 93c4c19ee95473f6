#include "outer/sync.h"

#include <torch/torch.h>

#include "common/error.h"

namespace xloco::outer {
namespace {

compress::CodecConfig base(const common::OuterConfig& c, const std::string& codec) {
  compress::CodecConfig cc;
  cc.codec = compress::parse_codec(codec);
  cc.block_size = static_cast<uint32_t>(c.block_size);
  cc.zstd_level = c.zstd_level;
  return cc;
}

}  // namespace

compress::CodecConfig uplink_codec(const common::OuterConfig& c) {
  auto cc = base(c, c.codec_up);
  cc.error_feedback = true;  // e_i stays on the provider (design §2)
  return cc;
}

compress::CodecConfig downlink_codec(const common::OuterConfig& c) {
  auto cc = base(c, c.codec_down);
  // The downlink residual is θ_true − θ_pub itself, kept on the head: no separate feedback.
  cc.error_feedback = false;
  return cc;
}

compress::CodecConfig full_state_codec() {
  compress::CodecConfig cc;
  cc.codec = compress::Codec::kFp32;
  cc.zstd_level = 0;
  cc.error_feedback = false;
  return cc;
}

std::vector<compress::TensorRef> views(torch::Tensor& flat, const Slots& slots) {
  XLOCO_ENFORCE(flat.is_contiguous() && flat.device().is_cpu() &&
                    flat.scalar_type() == torch::kFloat32,
                common::Error, "codec views need a contiguous CPU float32 buffer");
  std::vector<compress::TensorRef> out;
  out.reserve(slots.size());
  float* base_ptr = flat.data_ptr<float>();
  for (const auto& s : slots) out.push_back({s.name, s.shape, base_ptr + s.offset});
  return out;
}

std::vector<compress::ConstTensorRef> const_views(const torch::Tensor& flat, const Slots& slots) {
  XLOCO_ENFORCE(flat.is_contiguous() && flat.device().is_cpu() &&
                    flat.scalar_type() == torch::kFloat32,
                common::Error, "codec views need a contiguous CPU float32 buffer");
  std::vector<compress::ConstTensorRef> out;
  out.reserve(slots.size());
  const float* base_ptr = flat.data_ptr<float>();
  for (const auto& s : slots) out.push_back({s.name, s.shape, base_ptr + s.offset});
  return out;
}

void apply_update(compress::Decoder& decoder, const uint8_t* frame, size_t size,
                  const common::OuterConfig& c, torch::Tensor& theta_pub, const Slots& slots) {
  if (c.codec_down == "fp32") {
    decoder.decode(frame, size, views(theta_pub, slots));
  } else {
    decoder.decode_add(frame, size, views(theta_pub, slots));
  }
}

void apply_update(compress::Decoder& decoder, const std::vector<uint8_t>& frame,
                  const common::OuterConfig& c, torch::Tensor& theta_pub, const Slots& slots) {
  apply_update(decoder, frame.data(), frame.size(), c, theta_pub, slots);
}

}  // namespace xloco::outer
