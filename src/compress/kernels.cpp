#include "compress/kernels.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the wire format is little-endian");

// Hot loops get an AVX2 clone picked at load time; the portable SSE2 one stays the default.
// Neither enables FMA, and the build uses -ffp-contract=off, so both give the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define XLOCO_HOT __attribute__((target_clones("avx2", "default")))
#else
#define XLOCO_HOT
#endif

namespace xloco::compress::kernels {
namespace {

// Payload bytes sit at any offset of a frame: these GCC/Clang types read and write them
// unaligned without breaking strict aliasing (UBSan agrees), and, unlike memcpy into locals,
// GCC vectorizes loops over them.
struct __attribute__((packed, may_alias)) WireU16 {
  uint16_t v;
};
struct __attribute__((packed, may_alias)) WireU32 {
  uint32_t v;
};
struct __attribute__((packed, may_alias)) WireF32 {
  float v;
};

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr int32_t kInfBits = 0x7f800000;
constexpr uint16_t kBf16InfBits = 0x7f80u;
// Adding then subtracting 1.5·2^23 rounds to the nearest integer (ties to even) for |v| < 2^22,
// in plain float math that vectorizes without SSE4.1's roundps.
constexpr float kRoundMagic = 12582912.0f;
// fp32 and bf16 have no blocks; they are checked in chunks that stay in L1.
constexpr uint32_t kChunk = 2048;

inline uint32_t bits_of(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}
inline float float_of(uint32_t b) {
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}
inline uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

// The largest |v| as bits: for non-negative floats the integer order is the float order, and
// NaN and Inf sort above every finite value, so one integer max both finds the absmax and
// detects non-finite input, and it vectorizes where a float max reduction would not. (Signed,
// because SSE2 has no unsigned 32-bit compare; the values fit in 31 bits.)
XLOCO_HOT int32_t max_abs_bits(const float* __restrict w, uint32_t len) {
  int32_t mx = 0;
  for (uint32_t i = 0; i < len; ++i) {
    const auto b = static_cast<int32_t>(bits_of(w[i]) & kAbsMask);
    mx = b > mx ? b : mx;
  }
  return mx;
}

// w ← x + w, returning max_abs_bits of the new w.
XLOCO_HOT int32_t add_max_abs_bits(const float* __restrict x, float* __restrict w, uint32_t len) {
  int32_t mx = 0;
  for (uint32_t i = 0; i < len; ++i) {
    w[i] = x[i] + w[i];
    const auto b = static_cast<int32_t>(bits_of(w[i]) & kAbsMask);
    mx = b > mx ? b : mx;
  }
  return mx;
}

// The first element of w that is non-finite or above `limit` in magnitude (cold path).
EncodeDefect first_defect(const float* w, uint64_t len, float limit, uint64_t start) {
  for (uint64_t i = 0; i < len; ++i) {
    if (!std::isfinite(w[i])) return {Defect::kNonFinite, start + i};
    if (std::fabs(w[i]) > limit) return {Defect::kOutOfRange, start + i};
  }
  return {Defect::kNonFinite, start + len};
}

struct BlockScale {
  float scale;
  float inv;
};

// absmax ≤ levels · kMaxScale (checked by the caller) keeps the scale ≤ kMaxScale: both are
// powers of two times levels, so the division is exact at the boundary.
inline BlockScale block_scale(float absmax, float levels) {
  if (!(absmax >= kMinAbsmax)) return {0.0f, 0.0f};
  return {absmax / levels, levels / absmax};
}

// v·inv rounded to an integer in [−levels, levels]. The clamp is on the integer, where it
// compiles to pmaxsd/pminsd; a float std::min/max must keep NaN semantics and becomes
// compare-and-blend. (With inv = levels / absmax it never triggers; it guards the cast.)
inline int32_t quantize_value(float v, float inv, int32_t levels) {
  const auto q = static_cast<int32_t>((v * inv + kRoundMagic) - kRoundMagic);
  return std::min(std::max(q, -levels), levels);
}

XLOCO_HOT void quantize_int8(const float* __restrict w, uint32_t len, float inv,
                             uint8_t* __restrict q) {
  for (uint32_t i = 0; i < len; ++i) q[i] = static_cast<uint8_t>(quantize_value(w[i], inv, 127));
}

// The feedback variant updates w in place, so it takes one pointer and needs no alias check.
// w − q·scale is the decoder's q·scale exactly (one rounding, no FMA), so the residual is what
// the receiver is missing.
XLOCO_HOT void quantize_int8_feedback(float* __restrict w, uint32_t len, float scale, float inv,
                                      uint8_t* __restrict q) {
  for (uint32_t i = 0; i < len; ++i) {
    const int32_t r = quantize_value(w[i], inv, 127);
    q[i] = static_cast<uint8_t>(r);
    w[i] = w[i] - static_cast<float>(r) * scale;
  }
}

inline uint8_t pack_nibbles(int32_t lo, int32_t hi) {
  return static_cast<uint8_t>((lo + 8) | ((hi + 8) << 4));
}

XLOCO_HOT void quantize_int4(const float* __restrict w, uint32_t len, float inv,
                             uint8_t* __restrict q) {
  for (uint32_t k = 0; k < len / 2; ++k) {
    q[k] = pack_nibbles(quantize_value(w[2 * k], inv, 7), quantize_value(w[2 * k + 1], inv, 7));
  }
  if (len % 2 != 0) q[len / 2] = static_cast<uint8_t>(quantize_value(w[len - 1], inv, 7) + 8);
}

XLOCO_HOT void quantize_int4_feedback(float* __restrict w, uint32_t len, float scale, float inv,
                                      uint8_t* __restrict q) {
  for (uint32_t k = 0; k < len / 2; ++k) {
    const int32_t r0 = quantize_value(w[2 * k], inv, 7);
    const int32_t r1 = quantize_value(w[2 * k + 1], inv, 7);
    q[k] = pack_nibbles(r0, r1);
    w[2 * k] = w[2 * k] - static_cast<float>(r0) * scale;
    w[2 * k + 1] = w[2 * k + 1] - static_cast<float>(r1) * scale;
  }
  if (len % 2 != 0) {
    const int32_t r = quantize_value(w[len - 1], inv, 7);
    q[len / 2] = static_cast<uint8_t>(r + 8);
    w[len - 1] = w[len - 1] - static_cast<float>(r) * scale;
  }
}

// Round to nearest even; a finite value that rounds past bf16's largest finite value is
// clamped to it, so the encoder never emits an Inf that its peers would refuse.
inline uint16_t to_bf16(float v) {
  const uint32_t b = bits_of(v);
  uint32_t r = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
  r = (r & kBf16InfBits) == kBf16InfBits ? ((r & 0x8000u) | 0x7f7fu) : r;
  return static_cast<uint16_t>(r);
}
inline float from_bf16(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

XLOCO_HOT void encode_bf16(const float* __restrict w, uint32_t len, uint8_t* __restrict out) {
  auto* h = reinterpret_cast<WireU16*>(out);
  for (uint32_t i = 0; i < len; ++i) h[i].v = to_bf16(w[i]);
}

XLOCO_HOT void encode_bf16_feedback(float* __restrict w, uint32_t len, uint8_t* __restrict out) {
  auto* h = reinterpret_cast<WireU16*>(out);
  for (uint32_t i = 0; i < len; ++i) {
    const uint16_t r = to_bf16(w[i]);
    h[i].v = r;
    w[i] = w[i] - from_bf16(r);
  }
}

// fp32 and bf16: chunks of kChunk; with a residual, x + e is formed in e, then encoded.
std::optional<EncodeDefect> encode_elementwise(Codec codec, const float* x, float* residual,
                                               uint64_t n, uint8_t* out) {
  const uint64_t width = codec == Codec::kFp32 ? 4 : 2;
  for (uint64_t start = 0; start < n; start += kChunk) {
    const auto len = static_cast<uint32_t>(std::min<uint64_t>(kChunk, n - start));
    float* w = residual != nullptr ? residual + start : nullptr;
    const int32_t mx =
        w != nullptr ? add_max_abs_bits(x + start, w, len) : max_abs_bits(x + start, len);
    const float* src = w != nullptr ? w : x + start;
    if (mx >= kInfBits) return first_defect(src, len, FLT_MAX, start);
    uint8_t* dst = out + width * start;
    if (codec == Codec::kFp32) {
      std::memcpy(dst, src, 4 * static_cast<size_t>(len));
      if (w != nullptr) std::fill(w, w + len, 0.0f);
    } else if (w != nullptr) {
      encode_bf16_feedback(w, len, dst);
    } else {
      encode_bf16(src, len, dst);
    }
  }
  return std::nullopt;
}

std::optional<EncodeDefect> encode_blockwise(Codec codec, const float* x, float* residual,
                                             uint64_t n, uint32_t block_size, uint8_t* out) {
  const float levels = codec == Codec::kInt8 ? 127.0f : 7.0f;
  const float limit = max_encodable(codec);
  const uint64_t blocks = ceil_div(n, block_size);
  uint8_t* q = out + 4 * blocks;
  for (uint64_t b = 0; b < blocks; ++b) {
    const uint64_t start = b * block_size;
    const auto len = static_cast<uint32_t>(std::min<uint64_t>(block_size, n - start));
    float* w = residual != nullptr ? residual + start : nullptr;
    const int32_t mx =
        w != nullptr ? add_max_abs_bits(x + start, w, len) : max_abs_bits(x + start, len);
    const float* src = w != nullptr ? w : x + start;
    const float absmax = float_of(static_cast<uint32_t>(mx));
    if (mx >= kInfBits || absmax > limit) return first_defect(src, len, limit, start);
    const BlockScale s = block_scale(absmax, levels);
    reinterpret_cast<WireF32*>(out)[b].v = s.scale;
    if (codec == Codec::kInt8 && w != nullptr) {
      quantize_int8_feedback(w, len, s.scale, s.inv, q + start);
    } else if (codec == Codec::kInt8) {
      quantize_int8(src, len, s.inv, q + start);
    } else if (w != nullptr) {
      quantize_int4_feedback(w, len, s.scale, s.inv, q + start / 2);
    } else {
      quantize_int4(src, len, s.inv, q + start / 2);
    }
  }
  return std::nullopt;
}

XLOCO_HOT bool any_non_finite_fp32(const uint8_t* __restrict p, uint32_t len) {
  const auto* v = reinterpret_cast<const WireU32*>(p);
  int bad = 0;
  for (uint32_t i = 0; i < len; ++i) bad |= static_cast<int32_t>(v[i].v & kAbsMask) >= kInfBits;
  return bad != 0;
}

XLOCO_HOT bool any_non_finite_bf16(const uint8_t* __restrict p, uint32_t len) {
  const auto* h = reinterpret_cast<const WireU16*>(p);
  int bad = 0;
  for (uint32_t i = 0; i < len; ++i) bad |= (h[i].v & kBf16InfBits) == kBf16InfBits;
  return bad != 0;
}

std::optional<PayloadDefect> check_elementwise(Codec codec, const uint8_t* p, uint64_t n) {
  const uint64_t width = codec == Codec::kFp32 ? 4 : 2;
  for (uint64_t start = 0; start < n; start += kChunk) {
    const auto len = static_cast<uint32_t>(std::min<uint64_t>(kChunk, n - start));
    const uint8_t* chunk = p + width * start;
    const bool bad =
        codec == Codec::kFp32 ? any_non_finite_fp32(chunk, len) : any_non_finite_bf16(chunk, len);
    if (!bad) continue;
    for (uint32_t i = 0; i < len; ++i) {
      const float v = codec == Codec::kFp32
                          ? reinterpret_cast<const WireF32*>(chunk)[i].v
                          : from_bf16(reinterpret_cast<const WireU16*>(chunk)[i].v);
      if (!std::isfinite(v)) return PayloadDefect{Defect::kNonFinite, width * (start + i)};
    }
  }
  return std::nullopt;
}

XLOCO_HOT void decode_fp32_add(const uint8_t* __restrict p, uint64_t n, float* __restrict out) {
  const auto* v = reinterpret_cast<const WireF32*>(p);
  for (uint64_t i = 0; i < n; ++i) out[i] = out[i] + v[i].v;
}

XLOCO_HOT void decode_bf16(const uint8_t* __restrict p, uint64_t n, float* __restrict out,
                           bool add) {
  const auto* h = reinterpret_cast<const WireU16*>(p);
  if (add) {
    for (uint64_t i = 0; i < n; ++i) out[i] = out[i] + from_bf16(h[i].v);
  } else {
    for (uint64_t i = 0; i < n; ++i) out[i] = from_bf16(h[i].v);
  }
}

XLOCO_HOT void dequantize_int8(const uint8_t* __restrict q, uint32_t len, float scale,
                               float* __restrict out, bool add) {
  if (add) {
    for (uint32_t i = 0; i < len; ++i) {
      out[i] = out[i] + static_cast<float>(static_cast<int8_t>(q[i])) * scale;
    }
  } else {
    for (uint32_t i = 0; i < len; ++i) {
      out[i] = static_cast<float>(static_cast<int8_t>(q[i])) * scale;
    }
  }
}

XLOCO_HOT void dequantize_int4(const uint8_t* __restrict q, uint32_t len, float scale,
                               float* __restrict out, bool add) {
  const uint32_t pairs = len / 2;
  if (add) {
    for (uint32_t k = 0; k < pairs; ++k) {
      out[2 * k] = out[2 * k] + static_cast<float>((q[k] & 15) - 8) * scale;
      out[2 * k + 1] = out[2 * k + 1] + static_cast<float>((q[k] >> 4) - 8) * scale;
    }
  } else {
    for (uint32_t k = 0; k < pairs; ++k) {
      out[2 * k] = static_cast<float>((q[k] & 15) - 8) * scale;
      out[2 * k + 1] = static_cast<float>((q[k] >> 4) - 8) * scale;
    }
  }
  if (len % 2 != 0) {
    const float v = static_cast<float>((q[pairs] & 15) - 8) * scale;
    out[len - 1] = add ? out[len - 1] + v : v;
  }
}

// Each block of an int8/int4 payload (its scales first, then the codes): `block(start, len,
// scale, codes)`, where element i of the tensor is code i of `codes` (int8) or nibble i (int4).
template <class Block>
inline void for_each_block(const uint8_t* payload, uint64_t n, uint32_t block_size, Block&& block) {
  const uint64_t blocks = ceil_div(n, block_size);
  const uint8_t* q = payload + 4 * blocks;
  for (uint64_t b = 0; b < blocks; ++b) {
    const uint64_t start = b * block_size;
    const auto len = static_cast<uint32_t>(std::min<uint64_t>(block_size, n - start));
    block(start, len, reinterpret_cast<const WireF32*>(payload)[b].v, q);
  }
}


// ---------------------------------------------------------------- topk: sparse, 2- or 4-bit values

// The codes of one value, `Bits` (2 or 4) wide, packed from bit 0 of the first byte on:
// 2 bits: magnitude 1 or 2 (bit 0) and sign (bit 1); 4 bits: magnitude 1..8 (bits 0-2, stored
// as magnitude − 1) and sign (bit 3). Value = ±magnitude · scale.
template <uint32_t Bits>
struct TopkCode {
  static_assert(Bits == 2 || Bits == 4);
  static constexpr uint32_t kLevels = Bits == 2 ? 2 : 8;  // magnitudes 1..kLevels
  static constexpr uint32_t kSign = Bits == 2 ? 2u : 8u;
  static constexpr uint32_t kPerByte = 8 / Bits;
  static uint32_t at(const uint8_t* codes, uint32_t j) {
    return (codes[j / kPerByte] >> (Bits * (j % kPerByte))) & ((1u << Bits) - 1);
  }
  static void put(uint8_t* codes, uint32_t j, uint32_t code) {
    codes[j / kPerByte] = static_cast<uint8_t>(codes[j / kPerByte] | code << (Bits * (j % kPerByte)));
  }
  static uint32_t magnitude(uint32_t code) { return (code & (kSign - 1)) + 1; }
  static float value(uint32_t code, float scale) {
    // 2 bits: scale + scale is exact; 4 bits: one rounding of m · scale, the same everywhere.
    const float v = Bits == 2 ? ((code & 1u) != 0 ? scale + scale : scale)
                              : static_cast<float>(magnitude(code)) * scale;
    return (code & kSign) != 0 ? -v : v;
  }
  // The nearer level to |v|·inv (inv = 1 / scale), clamped to 1..kLevels, with v's sign.
  static uint32_t encode(float v, float inv) {
    const float r = std::fabs(v) * inv;
    uint32_t m;
    if constexpr (Bits == 2) {
      m = r >= 1.5f ? 2u : 1u;
    } else {
      // min first: r can be far above 8 (or inf) when the fit put the scale low.
      m = std::clamp(static_cast<uint32_t>(std::min(r, 8.0f) + 0.5f), 1u, kLevels);
    }
    return (m - 1) | (std::signbit(v) ? kSign : 0u);
  }
};

// The bits of |v| as a signed integer: for non-negative floats the integer order is the float
// order, and they fit in 31 bits (SSE2 compares signed integers only).
inline int32_t abs_key(float v) { return static_cast<int32_t>(bits_of(v) & kAbsMask); }

// Appends (position, key) for every i in [0, len) with key ≥ t, in position order; returns the
// count. `pos` and `key` need room for len entries.
uint32_t gather_at_least(const float* w, uint32_t len, int32_t t, uint16_t* pos, int32_t* key) {
  uint32_t c = 0;
  uint32_t i = 0;
#if defined(__SSE2__)
  // 16 keys per test, one mask; most chunks hold none of the few hundred keys ≥ t.
  const __m128i abs_mask = _mm_set1_epi32(static_cast<int32_t>(kAbsMask));
  const __m128i below = _mm_set1_epi32(t - 1);  // key ≥ t ⇔ key > t − 1 (t ≥ 0)
  for (; i + 16 <= len; i += 16) {
    const auto* p = reinterpret_cast<const __m128i*>(w + i);
    const __m128i a = _mm_and_si128(_mm_loadu_si128(p), abs_mask);
    const __m128i b = _mm_and_si128(_mm_loadu_si128(p + 1), abs_mask);
    const __m128i d = _mm_and_si128(_mm_loadu_si128(p + 2), abs_mask);
    const __m128i e = _mm_and_si128(_mm_loadu_si128(p + 3), abs_mask);
    auto m = static_cast<uint32_t>(
        _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(a, below))) |
        _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(b, below))) << 4 |
        _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(d, below))) << 8 |
        _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(e, below))) << 12);
    while (m != 0) {
      const uint32_t j = i + static_cast<uint32_t>(__builtin_ctz(m));
      pos[c] = static_cast<uint16_t>(j);
      key[c++] = abs_key(w[j]);
      m &= m - 1;
    }
  }
#endif
  for (; i < len; ++i) {
    if (abs_key(w[i]) >= t) {
      pos[c] = static_cast<uint16_t>(i);
      key[c++] = abs_key(w[i]);
    }
  }
  return c;
}

// The r-th largest key (1-based) of w[0], w[stride], w[2·stride], …, or 0 (gather everything)
// when there are fewer than r or r > 128. The r largest are kept sorted in a small array: with
// r ≪ the sample, few keys enter it, and each of the others costs one predictable compare.
int32_t sample_rank(const float* w, uint32_t len, uint32_t stride, uint32_t r) {
  if (r > 128 || static_cast<uint64_t>(r - 1) * stride >= len) return 0;
  int32_t top[128];  // descending; top[r - 1] the smallest kept
  uint32_t n = 0;
  for (uint32_t i = 0; i < len; i += stride) {
    const int32_t key = abs_key(w[i]);
    if (n == r && key <= top[r - 1]) continue;
    uint32_t j = n < r ? n++ : r - 1;
    for (; j > 0 && top[j - 1] < key; --j) top[j] = top[j - 1];
    top[j] = key;
  }
  return n == r ? top[r - 1] : 0;
}

// The k-th largest (1 ≤ k ≤ c) of c non-negative keys, by radix: the bits are fixed from the
// top, 8 at a time (7 for the last digit), each from a histogram of the keys that match the
// bits fixed so far. Four passes over the keys, with no data-dependent branch.
int32_t kth_largest(const int32_t* key, uint32_t c, uint32_t k) {
  uint32_t prefix = 0;  // the bits fixed so far, in place
  uint32_t need = k;    // rank of the wanted key among those matching the prefix
  for (const int shift : {23, 15, 7, 0}) {
    const uint32_t width = shift == 0 ? 7 : 8;
    const uint32_t above = shift + width;  // bits at and above it are fixed
    uint32_t hist[256] = {};
    for (uint32_t j = 0; j < c; ++j) {
      const auto u = static_cast<uint32_t>(key[j]);
      const bool match = above >= 31 || (u >> above) == (prefix >> above);
      hist[(u >> shift) & ((1u << width) - 1)] += match ? 1u : 0u;
    }
    uint32_t d = (1u << width) - 1;
    for (; d > 0 && hist[d] < need; --d) need -= hist[d];
    prefix |= d << shift;
  }
  return static_cast<int32_t>(prefix);
}

// The block's top-k positions by (|w| descending, position ascending), sorted ascending, into
// `pos`. A threshold t comes from a strided sample of the block: its r-th largest key, r chosen
// so that about 2k keys lie at or above it. One pass gathers every key ≥ t; if fewer than k
// did (a sample that missed the large values), t drops to a lower sample rank, at last to 0
// (every key). Once at least k keys ≥ t are gathered, the k-th largest key T is ≥ t, so the
// top k are all among them: those above T, then the first ones equal to T, taken in position
// order. The result depends on the block alone (exact, the same on every machine); the sample
// only decides how much work it is.
void select_topk(const float* w, uint32_t len, uint32_t k, uint16_t* pos) {
  if (k == 0) return;
  thread_local std::vector<uint16_t> cand_pos;
  thread_local std::vector<int32_t> cand_key;
  if (cand_pos.size() < len) {
    cand_pos.resize(len);
    cand_key.resize(len);
  }
  const uint32_t stride = std::max<uint32_t>(1, len / 128);
  // Rank r (1-based) in the sample: about 2k of the block's keys are expected at or above it.
  uint32_t r = std::max<uint32_t>(1, (2 * k) / stride);
  uint32_t c = 0;
  for (;;) {
    const int32_t t = sample_rank(w, len, stride, r);
    c = gather_at_least(w, len, t, cand_pos.data(), cand_key.data());
    if (c >= k || t == 0) break;
    r *= 2;  // a sample that missed the tail (1 block in 7 for k = 64 of 4096 in random order): lower t, at last to 0
  }
  const int32_t kth = kth_largest(cand_key.data(), c, k);
  uint32_t ties = k;  // how many keys equal to kth to take: k minus those above it
  for (uint32_t j = 0; j < c; ++j) ties -= cand_key[j] > kth ? 1u : 0u;
  uint32_t n = 0;
  for (uint32_t j = 0; j < c && n < k; ++j) {
    const int32_t key = cand_key[j];
    const bool take = key > kth || (key == kth && ties > 0);
    ties -= key == kth && ties > 0 ? 1u : 0u;
    pos[n] = cand_pos[j];
    n += take ? 1u : 0u;
  }
}

// The scale s of the levels ±s, ±2s (4 bits: ±s … ±8s) for the chosen values: least squares
// over their magnitudes (Lloyd's iterations from s = absmax / 2, or absmax / 8, each value at its
// nearer level), so that the levels sit where the sent values are rather than at absmax, which
// overshoots the smaller ones (by up to 2.5× at 1/32 of a heavy-tailed block). No iteration
// raises the squared error of the one before, so it is at most that of the first s; s ≤ absmax,
// and the same inputs give the same s everywhere (a fixed order of sums, in double).
template <uint32_t Bits>
BlockScale fit_topk_scale(const float* w, const uint16_t* chosen, uint32_t k, float absmax) {
  constexpr uint32_t kLevels = TopkCode<Bits>::kLevels;
  const BlockScale first = block_scale(absmax, static_cast<float>(kLevels));
  if (first.scale == 0.0f || k == 0) return first;
  double s = first.scale;
  for (int iter = 0; iter < (Bits == 2 ? 4 : 6); ++iter) {
    double num = 0, den = 0;
    for (uint32_t j = 0; j < k; ++j) {
      const double m = std::fabs(w[chosen[j]]);
      if constexpr (Bits == 2) {
        const bool big = m >= 1.5 * s;
        num += big ? 2 * m : m;
        den += big ? 4 : 1;
      } else {
        const double l = std::clamp(std::floor(m / s + 0.5), 1.0, double{kLevels});
        num += l * m;
        den += l * l;
      }
    }
    const double next = num / den;
    if (!(next > 0) || next == s) break;
    s = next;
  }
  const auto scale = static_cast<float>(s);
  // Within what the decoder accepts (the fit may land above absmax / levels, near a huge absmax).
  if (!(scale >= kMinAbsmax / kLevels) || scale > absmax || scale > kMaxScale) return first;
  return {scale, 1.0f / scale};
}

// Where block b of one tensor lies in a topk payload's four sections (frame.h), as byte
// offsets: every block but the tensor's last is full, so each part is at the tensor's start in
// its section plus b strides.
struct TopkStrides {
  TopkStrides(const TopkAt& at, uint32_t block_size, uint32_t topk, uint32_t bits)
      : at(at), k(std::min(topk, block_size)), code_bytes((k * bits + 7) / 8) {}
  uint64_t scale(uint64_t b) const { return at.scales + 4 * b; }
  uint64_t lo(uint64_t b) const { return at.lo + b * k; }
  uint64_t hi(uint64_t b) const { return at.hi + b * k; }
  uint64_t codes(uint64_t b) const { return at.codes + b * code_bytes; }
  TopkAt at;
  uint64_t k, code_bytes;  // of a full block
};

template <uint32_t Bits>
std::optional<EncodeDefect> encode_topk(const float* x, float* residual, uint64_t n,
                                        uint32_t block_size, uint32_t topk, uint8_t* payload,
                                        const TopkAt& at) {
  using Code = TopkCode<Bits>;
  const float limit = max_encodable(Codec::kTopk);
  thread_local std::vector<float> scratch;  // w without feedback
  const TopkStrides place(at, block_size, topk, Bits);
  for (uint64_t start = 0, b = 0; start < n; start += block_size, ++b) {
    const auto len = static_cast<uint32_t>(std::min<uint64_t>(block_size, n - start));
    const uint32_t k = std::min(topk, len);
    float* w = residual != nullptr ? residual + start : nullptr;
    int32_t mx;
    if (w != nullptr) {
      mx = add_max_abs_bits(x + start, w, len);
    } else {
      scratch.assign(x + start, x + start + len);
      w = scratch.data();
      mx = max_abs_bits(w, len);
    }
    const float absmax = float_of(static_cast<uint32_t>(mx));
    if (mx >= kInfBits || absmax > limit) return first_defect(w, len, limit, start);
    thread_local std::vector<uint16_t> chosen;
    chosen.resize(k);
    select_topk(w, len, k, chosen.data());
    const BlockScale s = fit_topk_scale<Bits>(w, chosen.data(), k, absmax);
    reinterpret_cast<WireF32*>(payload + place.scale(b))->v = s.scale;
    uint8_t* gap_lo = payload + place.lo(b);  // position gaps, low bytes, then high bytes
    uint8_t* gap_hi = payload + place.hi(b);
    uint8_t* codes = payload + place.codes(b);
    std::fill(codes, codes + (uint64_t{k} * Bits + 7) / 8, uint8_t{0});  // the block's codes
    uint32_t prev = 0;
    for (uint32_t j = 0; j < k; ++j) {
      const uint16_t i = chosen[j];
      const uint32_t gap = i - prev;
      prev = i;
      gap_lo[j] = static_cast<uint8_t>(gap);
      gap_hi[j] = static_cast<uint8_t>(gap >> 8);
      const uint32_t code = Code::encode(w[i], s.inv);
      Code::put(codes, j, code);
      w[i] = w[i] - Code::value(code, s.scale);  // what the receiver misses of this value
    }
  }
  return std::nullopt;
}

// One block of a topk payload as read from its four sections (frame.h).
struct TopkBlock {
  uint64_t start = 0;  // first element of the tensor
  uint32_t len = 0, k = 0;
  uint64_t scale_at = 0, lo_at = 0;  // byte offsets in the payload
  float scale = 0;
  const uint8_t* lo = nullptr;  // the k gaps' low bytes; their high bytes; the codes
  const uint8_t* hi = nullptr;
  const uint8_t* codes = nullptr;
  uint32_t gap(uint32_t j) const { return lo[j] | uint32_t{hi[j]} << 8; }
};

// Each block of one tensor of a topk payload, until `block(const TopkBlock&)` returns false.
template <class Block>
inline void for_each_topk_block(const uint8_t* payload, const TopkAt& at, uint64_t n,
                                uint32_t block_size, uint32_t topk, uint32_t topk_bits,
                                Block&& block) {
  const TopkStrides place(at, block_size, topk, topk_bits);
  TopkBlock t;
  for (uint64_t b = 0; t.start < n; t.start += block_size, ++b) {
    t.len = static_cast<uint32_t>(std::min<uint64_t>(block_size, n - t.start));
    t.k = std::min(topk, t.len);
    t.scale_at = place.scale(b);
    t.lo_at = place.lo(b);
    t.scale = reinterpret_cast<const WireF32*>(payload + t.scale_at)->v;
    t.lo = payload + t.lo_at;
    t.hi = payload + place.hi(b);
    t.codes = payload + place.codes(b);
    if (!block(t)) return;
  }
}

// Every code of either width is a valid value: only the scale and the positions can be wrong.
// Defects are at byte offsets in the payload (the scale, or the gap's low byte).
std::optional<PayloadDefect> check_topk(const uint8_t* payload, const TopkAt& at, uint64_t n,
                                        uint32_t block_size, uint32_t topk, uint32_t topk_bits) {
  std::optional<PayloadDefect> defect;
  for_each_topk_block(payload, at, n, block_size, topk, topk_bits, [&](const TopkBlock& b) {
    if (!std::isfinite(b.scale)) {
      defect = PayloadDefect{Defect::kNonFinite, b.scale_at};
    } else if (!(b.scale >= 0.0f && b.scale <= kMaxScale)) {
      defect = PayloadDefect{Defect::kBadScale, b.scale_at};
    } else {
      // p < len ≤ 2^16 before each gap is added: no overflow.
      uint32_t p = 0;
      for (uint32_t j = 0; j < b.k && !defect; ++j) {
        const uint32_t gap = b.gap(j);
        p += gap;
        if ((gap == 0 && j > 0) || p >= b.len) {
          defect = PayloadDefect{Defect::kBadIndex, b.lo_at + j};
        }
      }
    }
    return !defect;
  });
  return defect;
}

template <uint32_t Bits>
void decode_topk(const uint8_t* payload, const TopkAt& at, uint64_t n, uint32_t block_size,
                 uint32_t topk, float* out, bool add) {
  using Code = TopkCode<Bits>;
  // Block by block, zeroing each just before its values land, so they land in cache.
  for_each_topk_block(payload, at, n, block_size, topk, Bits, [&](const TopkBlock& b) {
    float* o = out + b.start;
    if (!add) std::fill(o, o + b.len, 0.0f);
    uint32_t p = 0;
    for (uint32_t j = 0; j < b.k; ++j) {
      p += b.gap(j);
      o[p] = o[p] + Code::value(Code::at(b.codes, j), b.scale);
    }
    return true;
  });
}

template <uint32_t Bits>
void topk_value_blocks(const uint8_t* payload, const TopkAt& at, uint64_t n, uint32_t block_size,
                       uint32_t topk, uint32_t* pos, float* value,
                       const std::function<void(uint64_t, uint32_t, uint32_t)>& block) {
  using Code = TopkCode<Bits>;
  for_each_topk_block(payload, at, n, block_size, topk, Bits, [&](const TopkBlock& b) {
    uint32_t p = 0;
    for (uint32_t j = 0; j < b.k; ++j) {
      p += b.gap(j);
      pos[j] = p;
      value[j] = 0.0f + Code::value(Code::at(b.codes, j), b.scale);  // as decode() writes it
    }
    block(b.start, b.len, b.k);
    return true;
  });
}

template <uint32_t Bits>
double sum_squares_topk(const uint8_t* payload, const TopkAt& at, uint64_t n,
                        uint32_t block_size, uint32_t topk) {
  using Code = TopkCode<Bits>;
  double sum = 0;
  for_each_topk_block(payload, at, n, block_size, topk, Bits, [&](const TopkBlock& b) {
    uint64_t m2 = 0;  // Σ magnitude²
    for (uint32_t j = 0; j < b.k; ++j) {
      const uint64_t m = Code::magnitude(Code::at(b.codes, j));
      m2 += m * m;
    }
    sum += static_cast<double>(b.scale) * b.scale * static_cast<double>(m2);
    return true;
  });
  return sum;
}

}  // namespace

float max_encodable(Codec codec) {
  switch (codec) {
    case Codec::kInt8:
      return 127.0f * kMaxScale;
    case Codec::kInt4:
      return 7.0f * kMaxScale;
    case Codec::kTopk:
      return 2.0f * kMaxScale;
    case Codec::kFp32:
    case Codec::kBf16:
      break;
  }
  return FLT_MAX;
}

std::optional<EncodeDefect> encode(Codec codec, const float* x, float* residual, uint64_t n,
                                   uint32_t block_size, uint8_t* out, uint32_t topk,
                                   uint32_t topk_bits, const TopkAt& at) {
  if (codec == Codec::kTopk) {
    return topk_bits == 4 ? encode_topk<4>(x, residual, n, block_size, topk, out, at)
                          : encode_topk<2>(x, residual, n, block_size, topk, out, at);
  }
  if (codec == Codec::kFp32 || codec == Codec::kBf16) {
    return encode_elementwise(codec, x, residual, n, out);
  }
  return encode_blockwise(codec, x, residual, n, block_size, out);
}

std::optional<PayloadDefect> check(Codec codec, const uint8_t* payload, uint64_t n,
                                   uint32_t block_size, uint32_t topk, uint32_t topk_bits,
                                   const TopkAt& at) {
  if (codec == Codec::kTopk) return check_topk(payload, at, n, block_size, topk, topk_bits);
  if (codec == Codec::kFp32 || codec == Codec::kBf16) {
    return check_elementwise(codec, payload, n);
  }
  const uint64_t blocks = ceil_div(n, block_size);
  for (uint64_t b = 0; b < blocks; ++b) {
    const float s = reinterpret_cast<const WireF32*>(payload)[b].v;
    if (!std::isfinite(s)) return PayloadDefect{Defect::kNonFinite, 4 * b};
    if (!(s >= 0.0f && s <= kMaxScale)) return PayloadDefect{Defect::kBadScale, 4 * b};
  }
  return std::nullopt;
}

void decode(Codec codec, const uint8_t* payload, uint64_t n, uint32_t block_size, float* out,
            bool add, uint32_t topk, uint32_t topk_bits, const TopkAt& at) {
  switch (codec) {
    case Codec::kTopk:
      if (topk_bits == 4) {
        decode_topk<4>(payload, at, n, block_size, topk, out, add);
      } else {
        decode_topk<2>(payload, at, n, block_size, topk, out, add);
      }
      return;
    case Codec::kFp32:
      if (add) {
        decode_fp32_add(payload, n, out);
      } else if (n != 0) {
        std::memcpy(out, payload, 4 * n);
      }
      return;
    case Codec::kBf16:
      decode_bf16(payload, n, out, add);
      return;
    case Codec::kInt8:
    case Codec::kInt4:
      for_each_block(payload, n, block_size, [&](uint64_t start, uint32_t len, float s, const uint8_t* q) {
        if (codec == Codec::kInt8) {
          dequantize_int8(q + start, len, s, out + start, add);
        } else {
          dequantize_int4(q + start / 2, len, s, out + start, add);
        }
      });
      return;
  }
}

void for_each_topk_value_block(const uint8_t* payload, const TopkAt& at, uint64_t n,
                               uint32_t block_size, uint32_t topk, uint32_t topk_bits,
                               uint32_t* pos, float* value,
                               const std::function<void(uint64_t, uint32_t, uint32_t)>& block) {
  if (topk_bits == 4) {
    topk_value_blocks<4>(payload, at, n, block_size, topk, pos, value, block);
  } else {
    topk_value_blocks<2>(payload, at, n, block_size, topk, pos, value, block);
  }
}

double sum_squares(Codec codec, const uint8_t* payload, uint64_t n, uint32_t block_size,
                   uint32_t topk, uint32_t topk_bits, const TopkAt& at) {
  double sum = 0;
  switch (codec) {
    case Codec::kTopk:
      return topk_bits == 4 ? sum_squares_topk<4>(payload, at, n, block_size, topk)
                            : sum_squares_topk<2>(payload, at, n, block_size, topk);
    case Codec::kFp32: {
      const auto* v = reinterpret_cast<const WireF32*>(payload);
      for (uint64_t i = 0; i < n; ++i) sum += static_cast<double>(v[i].v) * v[i].v;
      return sum;
    }
    case Codec::kBf16: {
      const auto* h = reinterpret_cast<const WireU16*>(payload);
      for (uint64_t i = 0; i < n; ++i) {
        const double x = from_bf16(h[i].v);
        sum += x * x;
      }
      return sum;
    }
    case Codec::kInt8:
    case Codec::kInt4:
      for_each_block(payload, n, block_size, [&](uint64_t start, uint32_t len, float s, const uint8_t* q) {
        int64_t q2 = 0;
        for (uint64_t i = start; i < start + len; ++i) {
          const int32_t v = codec == Codec::kInt8
                                ? static_cast<int8_t>(q[i])
                                : ((i % 2 == 0 ? q[i / 2] & 15 : q[i / 2] >> 4) - 8);
          q2 += v * v;
        }
        sum += static_cast<double>(s) * s * static_cast<double>(q2);
      });
      return sum;
  }
  return sum;
}

}  // namespace xloco::compress::kernels
