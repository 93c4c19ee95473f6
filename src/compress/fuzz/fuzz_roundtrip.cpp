// Arbitrary floats through encode and decode, every codec: non-finite input must be refused as
// kNonFinite, values beyond the codec's range as kOverLimit, and anything else must round-trip
// within the codec's bound (topk: at most k values a block, the rest in the residual), with
// finite residuals.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "compress/decoder.h"
#include "compress/encoder.h"
#include "compress/error.h"
#include "compress/kernels.h"
#include "fuzz_limits.h"

using namespace xloco::compress;

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

// The per-element bound of each codec (blocks below kMinAbsmax quantize to zero).
void check_bound(Codec codec, uint32_t block, const std::vector<float>& x,
                 const std::vector<float>& y) {
  for (size_t i = 0; i < x.size(); ++i) require(std::isfinite(y[i]));
  if (codec == Codec::kFp32) {
    require(x.empty() || std::memcmp(x.data(), y.data(), 4 * x.size()) == 0);
    return;
  }
  if (codec == Codec::kBf16) {
    for (size_t i = 0; i < x.size(); ++i) {
      const double err = std::fabs(double{x[i]} - y[i]);
      require(err <= std::ldexp(std::fabs(double{x[i]}), -8) * (1 + 1e-3) + 0x1p-134);
    }
    return;
  }
  if (codec == Codec::kTopk) return;  // checked against the residual, below
  const double levels = codec == Codec::kInt8 ? 127 : 7;
  for (size_t start = 0; start < x.size(); start += block) {
    const size_t end = std::min(x.size(), start + block);
    double m = 0;
    for (size_t i = start; i < end; ++i) m = std::max(m, std::fabs(double{x[i]}));
    for (size_t i = start; i < end; ++i) {
      const double err = std::fabs(double{x[i]} - y[i]);
      if (m < kernels::kMinAbsmax) {
        require(y[i] == 0.0f);
      } else {
        require(err <= m / (2 * levels) * (1 + 1e-4) + 0x1p-149);
      }
    }
  }
}

// topk sends at most k values per block, each at most 2 · absmax, and keeps the rest exactly:
// decoded + residual = x to one rounding (the first encode, when the residual was zero).
void check_topk(uint32_t block, uint32_t k, const std::vector<float>& x,
                const std::vector<float>& y, const std::vector<float>& residual) {
  require(residual.size() == x.size());
  for (size_t start = 0; start < x.size(); start += block) {
    const size_t end = std::min(x.size(), start + block);
    double m = 0;
    size_t sent = 0;
    for (size_t i = start; i < end; ++i) m = std::max(m, std::fabs(double{x[i]}));
    for (size_t i = start; i < end; ++i) {
      sent += y[i] != 0.0f ? 1 : 0;
      require(std::fabs(double{y[i]}) <= 2 * m);
      const double miss = std::fabs(double{x[i]} - (double{y[i]} + residual[i]));
      require(miss <= (std::fabs(double{x[i]}) + std::fabs(double{y[i]})) * 0x1p-24 + 0x1p-149);
    }
    require(sent <= k);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const auto codec = static_cast<Codec>(data[0] % 5);
  const uint32_t block = 2 * (1 + data[1] % 64);
  const uint32_t topk = codec == Codec::kTopk ? 1 + (data[0] / 5) % block : 0;
  const size_t n = std::min<size_t>((size - 2) / 4, 1 << 14);
  std::vector<float> x(n);
  if (n != 0) std::memcpy(x.data(), data + 2, 4 * n);
  bool finite = true;
  float absmax = 0;
  for (const float v : x) {
    finite = finite && std::isfinite(v);
    absmax = std::max(absmax, std::fabs(v));
  }
  const float range = kernels::max_encodable(codec);

  CodecConfig config;
  config.codec = codec;
  config.block_size = block;
  config.topk = topk;
  config.topk_bits = data[1] & 0x40 ? 4 : 2;  // bits 0-5 are the block, bit 7 zstd
  config.zstd_level = data[1] & 0x80 ? 1 : 0;
  config.limits = fuzz::fuzz_limits();
  Encoder encoder(config);
  const std::vector<ConstTensorRef> in = {{"x", {static_cast<int64_t>(n)}, x.data()}};
  std::vector<uint8_t> frame;
  try {
    encoder.encode(in, frame);
  } catch (const FrameError& e) {
    // Whichever defect comes first is reported.
    require((!finite && e.kind() == FrameErrorKind::kNonFinite) ||
            (absmax > range && e.kind() == FrameErrorKind::kOverLimit));
    return 0;
  }
  require(finite && absmax <= range);
  std::vector<float> y(n);
  Decoder decoder(config.limits);
  decoder.decode(frame, {{"x", {static_cast<int64_t>(n)}, y.data()}});
  check_bound(codec, block, x, y);
  if (codec == Codec::kTopk) check_topk(block, topk, x, y, *encoder.residual("x"));
  if (const std::vector<float>* e = encoder.residual("x")) {
    for (const float v : *e) require(std::isfinite(v));
    // A second round on top of the residual must encode unless x + e may leave the range.
    try {
      encoder.encode(in, frame);
    } catch (const FrameError&) {
      require(absmax > range / 2);
    }
  }
  return 0;
}
