#include "compress/codec.h"

#include <zstd.h>

#include <algorithm>
#include <limits>

#include "common/error.h"
#include "compress/error.h"
#include "compress/tensor_ref.h"

namespace xloco::compress {

std::string_view to_string(Codec codec) {
  switch (codec) {
    case Codec::kFp32:
      return "fp32";
    case Codec::kBf16:
      return "bf16";
    case Codec::kInt8:
      return "int8";
    case Codec::kInt4:
      return "int4";
    case Codec::kTopk:
      return "topk";
  }
  return "unknown";
}

Codec parse_codec(std::string_view name) {
  for (const Codec c : {Codec::kFp32, Codec::kBf16, Codec::kInt8, Codec::kInt4, Codec::kTopk}) {
    if (name == to_string(c)) return c;
  }
  throw common::ConfigError(
      fmt::format("codec '{}' is not one of fp32, bf16, int8, int4, topk", name));
}

const char* to_string(FrameErrorKind kind) {
  switch (kind) {
    case FrameErrorKind::kTruncated:
      return "truncated frame";
    case FrameErrorKind::kBadMagic:
      return "bad magic";
    case FrameErrorKind::kBadVersion:
      return "bad format version";
    case FrameErrorKind::kUnknownCodec:
      return "unknown codec";
    case FrameErrorKind::kOverLimit:
      return "over limit";
    case FrameErrorKind::kCorrupt:
      return "corrupt frame";
    case FrameErrorKind::kNonFinite:
      return "non-finite value";
    case FrameErrorKind::kMismatch:
      return "tensor mismatch";
  }
  return "frame error";
}

void validate(const CodecConfig& config) {
  XLOCO_ENFORCE(static_cast<uint8_t>(config.codec) <= static_cast<uint8_t>(Codec::kTopk),
                common::ConfigError, "compress.codec: unknown codec id {}",
                static_cast<int>(config.codec));
  XLOCO_ENFORCE(config.block_size >= 1 && config.block_size <= kMaxBlockSize, common::ConfigError,
                "compress.block_size: {} is outside [1, {}]", config.block_size, kMaxBlockSize);
  XLOCO_ENFORCE(config.codec != Codec::kInt4 || config.block_size % 2 == 0, common::ConfigError,
                "compress.block_size: int4 packs pairs of values, {} is odd", config.block_size);
  XLOCO_ENFORCE(config.codec != Codec::kTopk ||
                    (config.block_size <= kMaxTopkBlock && config.topk >= 1 &&
                     config.topk <= config.block_size),
                common::ConfigError,
                "compress: topk needs block_size ≤ {} and 1 ≤ topk ≤ block_size (block_size {}, "
                "topk {})",
                kMaxTopkBlock, config.block_size, config.topk);
  XLOCO_ENFORCE(config.codec != Codec::kTopk || config.topk_bits == 2 || config.topk_bits == 4,
                common::ConfigError, "compress: topk values are 2 or 4 bits, not {}",
                config.topk_bits);
  XLOCO_ENFORCE(config.zstd_level == 0 || (config.zstd_level >= ZSTD_minCLevel() &&
                                           config.zstd_level <= ZSTD_maxCLevel()),
                common::ConfigError, "compress.zstd_level: {} is outside [{}, {}]",
                config.zstd_level, ZSTD_minCLevel(), ZSTD_maxCLevel());
  XLOCO_ENFORCE(config.zstd_threads >= 0 && config.zstd_threads <= 256, common::ConfigError,
                "compress.zstd_threads: {} is outside [0, 256]", config.zstd_threads);
  XLOCO_ENFORCE(config.residual_decay >= 0.0f && config.residual_decay <= 1.0f,
                common::ConfigError, "compress.residual_decay: {} is outside [0, 1]",
                config.residual_decay);
  validate(config.limits);
}

void validate(const Limits& limits) {
  // 2^62 keeps every size sum in the frame code below 2^64.
  constexpr uint64_t kHardLimit = 1ull << 62;
  XLOCO_ENFORCE(limits.max_tensor_elements <= kHardLimit &&
                    limits.max_payload_bytes <= kHardLimit &&
                    limits.max_tensors <= std::numeric_limits<uint32_t>::max() &&
                    limits.max_name_bytes <= std::numeric_limits<uint16_t>::max() &&
                    limits.max_rank <= std::numeric_limits<uint8_t>::max(),
                common::ConfigError,
                "compress.limits: above what the frame format can carry (elements and payload "
                "bytes ≤ 2^62, tensors < 2^32, name bytes < 2^16, rank < 256)");
}

uint64_t topk_block_bytes(uint32_t len, uint32_t topk, uint32_t topk_bits) {
  const uint64_t k = std::min(len, topk);
  return 4 + 2 * k + (k * topk_bits + 7) / 8;
}

std::vector<TopkAt> topk_places(const std::vector<uint64_t>& numels, uint32_t block_size,
                                uint32_t topk, uint32_t topk_bits) {
  // Totals first: blocks (one scale each), values sent (one gap each), code bytes (the rest
  // of the tensor's bytes).
  struct Counts {
    uint64_t blocks = 0, values = 0, codes = 0;
  };
  std::vector<Counts> each(numels.size());
  Counts total;
  for (size_t i = 0; i < numels.size(); ++i) {
    const uint64_t n = numels[i], full = n / block_size, tail = n % block_size;
    const uint64_t k = std::min<uint64_t>(topk, block_size), kt = std::min<uint64_t>(topk, tail);
    const uint64_t blocks = full + (tail != 0), values = full * k + kt;
    each[i] = {blocks, values,
               tensor_payload_bytes(Codec::kTopk, n, block_size, topk, topk_bits) - 4 * blocks -
                   2 * values};
    total.blocks += each[i].blocks;
    total.values += each[i].values;
    total.codes += each[i].codes;
  }
  std::vector<TopkAt> at(numels.size());
  TopkAt next{0, 4 * total.blocks, 4 * total.blocks + total.values,
              4 * total.blocks + 2 * total.values};
  for (size_t i = 0; i < numels.size(); ++i) {
    at[i] = next;
    next.scales += 4 * each[i].blocks;
    next.lo += each[i].values;
    next.hi += each[i].values;
    next.codes += each[i].codes;
  }
  return at;
}

uint64_t tensor_payload_bytes(Codec codec, uint64_t n, uint32_t block_size, uint32_t topk,
                              uint32_t topk_bits) {
  switch (codec) {
    case Codec::kTopk: {
      const uint64_t full = n / block_size, tail = n % block_size;
      return full * topk_block_bytes(block_size, topk, topk_bits) +
             (tail != 0 ? topk_block_bytes(static_cast<uint32_t>(tail), topk, topk_bits) : 0);
    }
    case Codec::kFp32:
      return 4 * n;
    case Codec::kBf16:
      return 2 * n;
    case Codec::kInt8:
    case Codec::kInt4: {
      const uint64_t blocks = n / block_size + (n % block_size != 0);
      return 4 * blocks + (codec == Codec::kInt8 ? n : n / 2 + n % 2);
    }
  }
  return 0;
}

uint64_t checked_numel(const Shape& shape, const std::string& name) {
  constexpr uint64_t kMax = 1ull << 62;
  uint64_t n = 1;
  for (const int64_t d : shape) {
    XLOCO_FRAME_ENFORCE(d >= 0 && static_cast<uint64_t>(d) <= kMax &&
                            (d == 0 || n <= kMax / static_cast<uint64_t>(d)),
                        kMismatch, "tensor '{}': dimension {} gives more than 2^62 elements", name,
                        d);
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

}  // namespace xloco::compress
