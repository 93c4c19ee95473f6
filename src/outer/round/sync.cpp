#include "outer/round/sync.h"

#include <algorithm>

#include "common/error.h"
#include "compress/torch_adapter.h"

namespace xloco::outer {
namespace {

compress::CodecConfig base(const common::OuterConfig& c, common::CodecKind codec) {
  compress::CodecConfig cc;
  cc.codec = to_codec(codec);
  cc.block_size = static_cast<uint32_t>(c.block_size);
  if (cc.codec == compress::Codec::kTopk) {
    cc.topk = static_cast<uint32_t>(c.topk > 0 ? c.topk : std::max(1, c.block_size / 64));
    cc.topk_bits = static_cast<uint32_t>(c.topk_bits);
  }
  cc.zstd_level = c.zstd_level;
  return cc;
}

}  // namespace

compress::Codec to_codec(common::CodecKind kind) {
  switch (kind) {
    case common::CodecKind::kFp32: return compress::Codec::kFp32;
    case common::CodecKind::kBf16: return compress::Codec::kBf16;
    case common::CodecKind::kInt8: return compress::Codec::kInt8;
    case common::CodecKind::kInt4: return compress::Codec::kInt4;
    case common::CodecKind::kTopk: return compress::Codec::kTopk;
  }
  return compress::Codec::kFp32;
}

compress::CodecConfig uplink_codec(const common::OuterConfig& c) {
  auto cc = base(c, c.codec_up);
  cc.error_feedback = true;  // e_i stays on the provider (design §2)
  cc.residual_decay = static_cast<float>(c.ef_decay);
  return cc;
}

compress::CodecConfig downlink_codec(const common::OuterConfig& c) {
  auto cc = base(c, c.codec_down);
  if (cc.codec == compress::Codec::kTopk && c.topk_down > 0) cc.topk = static_cast<uint32_t>(c.topk_down);
  if (cc.codec == compress::Codec::kTopk && c.topk_bits_down > 0) {
    cc.topk_bits = static_cast<uint32_t>(c.topk_bits_down);
  }
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

std::vector<Fragment> split_fragments(const common::FlatLayout& layout, int count) {
  const size_t n = layout.slots.size();
  XLOCO_ENFORCE(count >= 1 && static_cast<size_t>(count) <= n, common::ConfigError,
                "config: outer.fragments = {} must be between 1 and the model's {} parameter tensors",
                count, n);
  std::vector<Fragment> out(static_cast<size_t>(count));
  size_t i = 0;
  int64_t taken = 0;
  for (size_t g = 0; g < out.size(); ++g) {
    Fragment& f = out[g];
    f.layout.numel = layout.numel;
    f.layout.buffers_offset = layout.buffers_offset;
    f.begin = layout.slots[i].offset;
    const size_t reserved = out.size() - g - 1;  // one tensor at least for each group after it
    const double target = static_cast<double>(layout.numel) * static_cast<double>(g + 1) /
                          static_cast<double>(count);
    do {
      f.layout.slots.push_back(layout.slots[i]);
      taken += layout.slots[i].numel;
      ++i;
      // The next tensor joins while that leaves the cut nearer this group's share.
    } while (i < n - reserved &&
             (g + 1 == out.size() ||
              static_cast<double>(taken) + static_cast<double>(layout.slots[i].numel) / 2 < target));
    f.end = f.layout.slots.back().offset + f.layout.slots.back().numel;
  }
  if (count > 1) out.push_back({layout, 0, layout.numel});
  return out;
}

void apply_update(compress::Decoder& decoder, const uint8_t* frame, size_t size,
                  const common::OuterConfig& c, torch::Tensor& theta_pub,
                  const common::FlatLayout& layout) {
  if (c.codec_down == common::CodecKind::kFp32) {
    compress::decode(decoder, frame, size, layout, theta_pub);
  } else {
    compress::decode_add(decoder, frame, size, layout, theta_pub);
  }
}

}  // namespace xloco::outer
