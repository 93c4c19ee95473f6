// Per-tensor quantize / dequantize loops, the hot part of the codec. They are plain loops over
// contiguous floats so that the compiler vectorizes them, and they use only elementwise IEEE
// float operations (one rounding each, no FMA, no reductions over floats): the same payload
// bytes give the same floats on every machine, which keeps replicas bit-identical (design §2).
// Payload pointers need no alignment. Frame layout and error messages live elsewhere.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "compress/codec.h"

namespace xloco::compress::kernels {

// The largest block scale a frame may carry: |q| · scale then stays finite for every code a
// frame can hold (|q| ≤ 128 · 2^120 = 2^127 < FLT_MAX), so decoding cannot overflow.
inline constexpr float kMaxScale = 0x1p120f;
// A block whose absmax is below this quantizes to zeros (and stays in the residual), so that
// levels / absmax cannot overflow.
inline constexpr float kMinAbsmax = 0x1p-119f;

// The largest |x + residual| a codec encodes: levels · kMaxScale for int8 (≈1.7e38) and int4
// (≈9.3e36), FLT_MAX for fp32 and bf16 (bf16 rounds values above its own maximum down to it).
float max_encodable(Codec codec);

enum class Defect {
  kNonFinite,   // NaN or Inf
  kOutOfRange,  // finite but above max_encodable (encode only)
  kBadScale,    // a block scale that is negative or above kMaxScale (decode only)
  kBadIndex,    // topk: a position outside its block, or a zero gap after the first (decode only)
};

struct EncodeDefect {
  Defect defect;
  uint64_t index;  // element of the tensor
};

// Writes the payload of one tensor of n elements to `out` (tensor_payload_bytes bytes).
// With `residual` set it quantizes w = x + residual and leaves the quantization error in
// `residual`; with null it quantizes w = x. On a defect the payload is unspecified and
// `residual` holds w for the defective element's block (so callers can report it) and
// unspecified values elsewhere.
// topk keeps in `residual` every value it did not send, and for those it sent the difference
// to their 2-bit (or 4-bit, `topk_bits`) value. The positions sent are the topk largest |x + residual| per block, ties
// to the lower position: the same input gives the same bytes on every machine.
// topk: `out` is the start of the whole payload, and the tensor's parts go where `at` says
// (codec.h topk_places); for the other codecs `out` is the tensor's own range.
std::optional<EncodeDefect> encode(Codec codec, const float* x, float* residual, uint64_t n,
                                   uint32_t block_size, uint8_t* out, uint32_t topk = 0,
                                   uint32_t topk_bits = 2, const TopkAt& at = {});

struct PayloadDefect {
  Defect defect;
  uint64_t byte_offset;  // within this tensor's range (topk: within the payload)
};

// Checks one tensor's payload before anything is written: non-finite values (fp32, bf16) or
// scales that are non-finite, negative or above kMaxScale (int8, int4).
// topk also: positions (sums of the gaps sent) inside their block and strictly increasing (every
// gap after the first ≥ 1, so none repeats). `payload` and `at` as for encode.
std::optional<PayloadDefect> check(Codec codec, const uint8_t* payload, uint64_t n,
                                   uint32_t block_size, uint32_t topk = 0,
                                   uint32_t topk_bits = 2, const TopkAt& at = {});

// out = deq(payload), or out += deq(payload) when `add`. Only for payloads check() accepted.
void decode(Codec codec, const uint8_t* payload, uint64_t n, uint32_t block_size, float* out,
            bool add, uint32_t topk = 0, uint32_t topk_bits = 2, const TopkAt& at = {});

// A topk payload's blocks (only for payloads check() accepted), each as its sent values:
// block(start, len, n) after writing the block's n positions (within it, increasing) to `pos`
// and their values to `value` (the floats decode() writes; each holds min(topk, block_size)).
void for_each_topk_value_block(const uint8_t* payload, const TopkAt& at, uint64_t n,
                               uint32_t block_size, uint32_t topk, uint32_t topk_bits,
                               uint32_t* pos, float* value,
                               const std::function<void(uint64_t start, uint32_t len, uint32_t n)>& block);

// Σ deq(payload)², accumulated in double (an int8/int4 block adds scale² · Σq²), so that a
// frame's norm is known without writing its values anywhere. Only for payloads check() accepted;
// the result is finite for every such payload (|deq| < 2^128 each).
double sum_squares(Codec codec, const uint8_t* payload, uint64_t n, uint32_t block_size,
                   uint32_t topk = 0, uint32_t topk_bits = 2, const TopkAt& at = {});

}  // namespace xloco::compress::kernels
