// The sending side of the codec: quantizes a list of named fp32 tensors into one frame and
// owns the per-tensor error-feedback residuals (design §2). One Encoder per link and direction;
// not thread-safe. The decoder and the frame layout live in decoder.h and frame.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "compress/codec.h"
#include "compress/tensor_ref.h"

struct ZSTD_outBuffer_s;

namespace xloco::compress {

struct EncodeStats {
  uint64_t payload_bytes = 0;  // quantized, before zstd
  uint64_t frame_bytes = 0;    // on the wire, header and table included
  bool zstd = false;           // false when compression was off or did not pay
};

class Encoder {
 public:
  // Throws common::ConfigError on a bad config.
  explicit Encoder(CodecConfig config);
  ~Encoder();
  Encoder(Encoder&&) noexcept;
  Encoder& operator=(Encoder&&) noexcept;

  // Writes one frame holding Q(x + e) for every input into `frame` (its capacity is reused)
  // and, with error feedback on, keeps e ← (x + e) − deq(Q(x + e)) per tensor name, exactly as
  // a decoder will reconstruct it. Inputs are checked (names unique and within limits, shapes
  // equal to those of earlier encodes) before any state changes. A NaN or Inf in x + e throws
  // FrameError(kNonFinite), a value beyond kernels::max_encodable (≈1.7e38 for int8, 9.3e36
  // for int4) FrameError(kOverLimit), both naming tensor and element; either resets all
  // residuals to zero, since they would otherwise hold half a round.
  void encode(const std::vector<ConstTensorRef>& inputs, std::vector<uint8_t>& frame);
  std::vector<uint8_t> encode(const std::vector<ConstTensorRef>& inputs);

  // The residual carried for `name`, or null before its first encode. fp32 is exact and keeps
  // none; neither does an encoder with error feedback off.
  const std::vector<float>* residual(std::string_view name) const;
  void reset_residuals();
  // Puts back a residual saved from residual() (a provider restarting, outer/provider/provider.cpp).
  // Throws FrameError(kMismatch) when this encoder keeps no residuals (fp32, or feedback off),
  // and FrameError(kNonFinite) on a NaN or Inf; the next encode checks its size as usual.
  void set_residual(std::string_view name, std::vector<float> values);

  const CodecConfig& config() const { return config_; }
  const EncodeStats& last_stats() const { return stats_; }

 private:
  float* residual_for(const std::string& name, uint64_t numel);

  CodecConfig config_;
  std::unordered_map<std::string, std::vector<float>> residuals_;
  std::unique_ptr<uint8_t[]> scratch_;  // one quantized tensor before zstd; never zero-filled
  uint64_t scratch_bytes_ = 0;
  struct Zstd;
  // Feeds `size` bytes to the compressor; `flush` ends the zstd block there.
  void compress_part(ZSTD_outBuffer_s& out, const uint8_t* data, uint64_t size, bool flush);
  std::unique_ptr<Zstd> zstd_;
  EncodeStats stats_;
};

}  // namespace xloco::compress
