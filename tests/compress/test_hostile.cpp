// Frames from other organisations' machines: every malformed input gives its own FrameError
// kind, allocates nothing it declares, and leaves the targets untouched.
#include <doctest/doctest.h>
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>

#include "alloc_probe.h"
#include "compress/decoder.h"
#include "compress/encoder.h"
#include "compress/error.h"
#include "compress/frame.h"
#include "helpers.h"

namespace xloco::compress {
namespace {

using testing::get;
using testing::model_like;
using testing::put;
using testing::TensorSet;

constexpr size_t kPayloadBytesAt = 20;
constexpr size_t kStoredBytesAt = 28;

std::vector<uint8_t> make_frame(Codec codec, int zstd_level, const TensorSet& in) {
  CodecConfig c;
  c.codec = codec;
  c.zstd_level = zstd_level;
  if (codec == Codec::kTopk) c.topk = 8;  // of each 256-value block
  return Encoder(c).encode(in.inputs());
}

// Decodes `frame` into a copy of `like` filled with a sentinel and returns the error kind;
// checks that a failed decode wrote nothing.
std::optional<FrameErrorKind> decode_kind(const uint8_t* frame, size_t size, const TensorSet& like,
                                          const Limits& limits = {}) {
  TensorSet out = like.like(42.0f);
  Decoder dec(limits);
  try {
    dec.decode(frame, size, out.targets());
  } catch (const FrameError& e) {
    bool untouched = true;
    for (const auto& d : out.data) {
      for (const float v : d) untouched = untouched && v == 42.0f;
    }
    REQUIRE(untouched);
    return e.kind();
  }
  return std::nullopt;
}

std::optional<FrameErrorKind> decode_kind(const std::vector<uint8_t>& frame, const TensorSet& like,
                                          const Limits& limits = {}) {
  return decode_kind(frame.data(), frame.size(), like, limits);
}

// A raw frame with its payload zstd-compressed afterwards, so that payload edits made on the
// raw frame reach the decoder through zstd as well.
std::vector<uint8_t> recompress(const std::vector<uint8_t>& raw) {
  const FrameInfo info = parse_frame(raw.data(), raw.size(), Limits{});
  std::vector<uint8_t> out(raw.begin(), raw.begin() + static_cast<long>(info.stored_offset));
  out.resize(info.stored_offset + ZSTD_compressBound(info.payload_bytes));
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  const size_t c =
      ZSTD_compress2(cctx, out.data() + info.stored_offset, out.size() - info.stored_offset,
                     raw.data() + info.stored_offset, info.payload_bytes);
  ZSTD_freeCCtx(cctx);
  REQUIRE_FALSE(ZSTD_isError(c));
  out.resize(info.stored_offset + c);
  out[7] = kFlagZstd;
  put<uint64_t>(out, kStoredBytesAt, c);
  return out;
}

TEST_SUITE("hostile") {
  TEST_CASE("a valid frame truncated at every byte offset is Truncated") {
    const TensorSet in = model_like(1);
    for (const Codec codec : {Codec::kFp32, Codec::kInt8, Codec::kInt4, Codec::kTopk}) {
      for (const int level : {0, 1}) {
        const auto frame = make_frame(codec, level, in);
        REQUIRE(decode_kind(frame, in) == std::nullopt);
        for (size_t len = 0; len < frame.size(); ++len) {
          const auto kind = decode_kind(frame.data(), len, in);
          if (kind != FrameErrorKind::kTruncated) {
            FAIL_CHECK("frame cut to " << len << " of " << frame.size() << " bytes: kind "
                                       << (kind ? static_cast<int>(*kind) : -1));
          }
        }
      }
    }
  }

  TEST_CASE("wrong magic, version, codec, flags, block size, trailing bytes") {
    const TensorSet in = model_like(2);
    const auto good = make_frame(Codec::kInt8, 1, in);
    auto f = good;
    f[0] = 'Y';
    CHECK(decode_kind(f, in) == FrameErrorKind::kBadMagic);
    f = good;
    put<uint16_t>(f, 4, 1);  // version 1 had no topk field
    CHECK(decode_kind(f, in) == FrameErrorKind::kBadVersion);
    put<uint16_t>(f, 4, 2);  // version 2 sent topk positions, not gaps
    CHECK(decode_kind(f, in) == FrameErrorKind::kBadVersion);
    put<uint16_t>(f, 4, 3);  // version 3 interleaved a topk block's parts
    CHECK(decode_kind(f, in) == FrameErrorKind::kBadVersion);
    put<uint16_t>(f, 4, 5);
    CHECK(decode_kind(f, in) == FrameErrorKind::kBadVersion);
    f = good;
    f[6] = 5;
    CHECK(decode_kind(f, in) == FrameErrorKind::kUnknownCodec);
    f = good;
    put<uint32_t>(f, 36, 8);  // a topk count on an int8 frame
    CHECK(decode_kind(f, in) == FrameErrorKind::kCorrupt);
    f[6] = 255;
    CHECK(decode_kind(f, in) == FrameErrorKind::kUnknownCodec);
    f = good;
    f[7] |= 0x80;
    CHECK(decode_kind(f, in) == FrameErrorKind::kCorrupt);
    f = good;
    f[7] |= kFlagTopk4;  // 4-bit topk values on an int8 frame
    CHECK(decode_kind(f, in) == FrameErrorKind::kCorrupt);
    f = good;
    put<uint32_t>(f, 8, 0);
    CHECK(decode_kind(f, in) == FrameErrorKind::kCorrupt);
    f = good;
    put<uint32_t>(f, 8, 128);  // valid, but the table's byte ranges no longer add up
    CHECK(decode_kind(f, in) == FrameErrorKind::kCorrupt);
    f = good;
    f.push_back(0);
    CHECK(decode_kind(f, in) == FrameErrorKind::kCorrupt);
    f = good;
    f[7] = 0;  // claims raw, but stores fewer bytes than the payload
    CHECK(decode_kind(f, in) == FrameErrorKind::kCorrupt);
  }

  TEST_CASE("declared sizes over the limits are refused before any allocation") {
    const TensorSet in = model_like(3);
    const auto good = make_frame(Codec::kInt8, 1, in);
    const auto expect_over_limit = [&](const std::vector<uint8_t>& f, const Limits& limits) {
      testing::reset_largest_allocation();
      CHECK(decode_kind(f, in, limits) == FrameErrorKind::kOverLimit);
      CHECK(testing::largest_allocation() < (64u << 10));
    };
    auto f = good;
    put<uint64_t>(f, kPayloadBytesAt, 1ull << 60);
    expect_over_limit(f, {});
    f = good;
    put<uint32_t>(f, 12, std::numeric_limits<uint32_t>::max());  // tensor count
    expect_over_limit(f, {});
    f = good;
    // First dimension of the first tensor: header, u16 name length, name, u8 rank.
    const size_t dim0 = kHeaderBytes + 2 + in.names[0].size() + 1;
    put<uint64_t>(f, dim0, 1ull << 60);
    expect_over_limit(f, {});
    Limits small;
    small.max_name_bytes = 8;
    expect_over_limit(good, small);
    small = {};
    small.max_payload_bytes = 1000;
    expect_over_limit(good, small);
    small = {};
    small.max_rank = 1;
    expect_over_limit(good, small);
  }

  TEST_CASE("a zstd frame declaring a huge content size is Corrupt, not an allocation") {
    const TensorSet in = model_like(4);
    auto f = make_frame(Codec::kInt8, 1, in);
    const FrameInfo info = parse_frame(f.data(), f.size(), {});
    REQUIRE(info.zstd);
    // Replace the stored zstd frame by one that declares 2^40 content bytes.
    std::vector<uint8_t> bomb(f.begin(), f.begin() + static_cast<long>(info.stored_offset));
    // Magic, descriptor (8-byte content size, window byte, checksum), window, size 2^40.
    const uint8_t zstd_header[] = {0x28, 0xb5, 0x2f, 0xfd, 0xc4, 0, 0, 0, 0, 0, 0, 1, 0, 0};
    bomb.insert(bomb.end(), std::begin(zstd_header), std::end(zstd_header));
    put<uint64_t>(bomb, kStoredBytesAt, sizeof(zstd_header));
    testing::reset_largest_allocation();
    CHECK(decode_kind(bomb, in) == FrameErrorKind::kCorrupt);
    CHECK(testing::largest_allocation() < (64u << 10));
  }

  TEST_CASE("corrupted zstd payload bytes are Corrupt (content checksum)") {
    const TensorSet in = model_like(5);
    const auto good = make_frame(Codec::kInt8, 1, in);
    const FrameInfo info = parse_frame(good.data(), good.size(), {});
    REQUIRE(info.zstd);
    TensorSet clean = in.like(0.0f);
    Decoder().decode(good, clean.targets());
    size_t caught = 0;
    for (size_t at = info.stored_offset; at < good.size(); ++at) {
      auto f = good;
      f[at] ^= 0x20;
      const auto kind = decode_kind(f, in);
      if (kind) {
        REQUIRE(*kind == FrameErrorKind::kCorrupt);
        ++caught;
      } else {
        // A flip zstd cannot notice (e.g. a window size unused by one-shot decoding) must not
        // change the decoded values.
        TensorSet out = in.like(0.0f);
        Decoder().decode(f, out.targets());
        REQUIRE(out.data == clean.data);
      }
    }
    MESSAGE(caught << " of " << info.stored_bytes << " single-byte flips rejected");
    CHECK(caught >= info.stored_bytes - 4);
  }

  TEST_CASE("NaN and Inf in a frame are NonFinite, raw and zstd") {
    TensorSet in;
    in.add("a", {10}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
    const auto reference = make_frame(Codec::kFp32, 0, in);
    const FrameInfo info = parse_frame(reference.data(), reference.size(), {});
    for (const float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity()}) {
      auto fp32 = make_frame(Codec::kFp32, 0, in);
      put<float>(fp32, info.stored_offset + 4 * 7, bad);
      CHECK(decode_kind(fp32, in) == FrameErrorKind::kNonFinite);
      CHECK(decode_kind(recompress(fp32), in) == FrameErrorKind::kNonFinite);

      auto int8 = make_frame(Codec::kInt8, 0, in);
      put<float>(int8, info.stored_offset, bad);  // the only block's scale
      CHECK(decode_kind(int8, in) == FrameErrorKind::kNonFinite);
      CHECK(decode_kind(recompress(int8), in) == FrameErrorKind::kNonFinite);
    }
    auto bf16 = make_frame(Codec::kBf16, 0, in);
    put<uint16_t>(bf16, info.stored_offset + 2 * 3, 0xff80);  // −Inf
    CHECK(decode_kind(bf16, in) == FrameErrorKind::kNonFinite);
    put<uint16_t>(bf16, info.stored_offset + 2 * 3, 0x7fc1);  // NaN
    CHECK(decode_kind(bf16, in) == FrameErrorKind::kNonFinite);

    auto int4 = make_frame(Codec::kInt4, 0, in);
    put<float>(int4, info.stored_offset, -1.0f);
    CHECK(decode_kind(int4, in) == FrameErrorKind::kCorrupt);
    put<float>(int4, info.stored_offset, 1e37f);  // q · scale could overflow
    CHECK(decode_kind(int4, in) == FrameErrorKind::kCorrupt);
  }

  TEST_CASE("NaN and Inf given to the encoder are NonFinite, naming the tensor") {
    TensorSet in = model_like(6);
    in.data[2][100] = std::numeric_limits<float>::quiet_NaN();
    for (const Codec codec : {Codec::kFp32, Codec::kBf16, Codec::kInt8, Codec::kInt4, Codec::kTopk}) {
      CodecConfig c;
      c.codec = codec;
      c.topk = codec == Codec::kTopk ? 8 : 0;
      Encoder enc(c);
      try {
        enc.encode(in.inputs());
        FAIL("NaN accepted");
      } catch (const FrameError& e) {
        CHECK(e.kind() == FrameErrorKind::kNonFinite);
        CHECK(std::string(e.what()).find("transformer.h.0.attn.c_attn.weight") !=
              std::string::npos);
        CHECK(std::string(e.what()).find("element 100") != std::string::npos);
      }
      if (codec == Codec::kInt8) {
        const std::vector<float>& r = *enc.residual(in.names[0]);
        CHECK(std::all_of(r.begin(), r.end(), [](float v) { return v == 0.0f; }));
      }
    }
  }

  TEST_CASE("topk: positions outside their block or repeated, bad scales, bad counts are refused") {
    const TensorSet in = model_like(11);
    const auto good = make_frame(Codec::kTopk, 0, in);
    REQUIRE(decode_kind(good, in) == std::nullopt);
    const FrameInfo info = parse_frame(good.data(), good.size(), Limits{});
    REQUIRE(info.topk == 8);
    // The payload's four sections (frame.h): scales, gaps' low bytes, high bytes, codes; the
    // first tensor's first block starts each. A block's gap j lies at lo + j and hi + j.
    const size_t base = info.stored_offset;
    const TopkAt& at0 = info.tensors[0].topk_at;
    REQUIRE(at0.scales == 0);
    REQUIRE(at0.lo > 0);
    REQUIRE(at0.hi > at0.lo);
    const size_t block0 = base;  // its scale
    struct GapAt {
      size_t lo, hi;
    };
    const GapAt first{base + at0.lo, base + at0.hi};
    const auto set_gap = [&](std::vector<uint8_t>& f, GapAt b, uint32_t, uint32_t j,
                             uint32_t gap) {
      f[b.lo + j] = static_cast<uint8_t>(gap);
      f[b.hi + j] = static_cast<uint8_t>(gap >> 8);
    };
    const auto gap = [&](const std::vector<uint8_t>& f, uint32_t j) {
      return f[first.lo + j] | uint32_t{f[first.hi + j]} << 8;
    };
    uint32_t last = 0;  // the block's last position: the sum of its gaps
    for (uint32_t j = 0; j < 8; ++j) last += gap(good, j);
    REQUIRE(last < 256);
    for (const int level : {0, 1}) {
      CAPTURE(level);
      const auto frame_of = [&](std::vector<uint8_t> f) { return level == 0 ? f : recompress(f); };
      auto f = good;
      set_gap(f, first, 8, 0, 256);  // the block has 256 values: 0..255
      CHECK(decode_kind(frame_of(f), in) == FrameErrorKind::kCorrupt);
      f = good;
      set_gap(f, first, 8, 7, gap(good, 7) + 256 - last);  // the last position at 256
      CHECK(decode_kind(frame_of(f), in) == FrameErrorKind::kCorrupt);
      f = good;
      set_gap(f, first, 8, 7, gap(good, 7) + 255 - last);  // at 255: still inside
      CHECK(decode_kind(frame_of(f), in) == std::nullopt);
      f = good;
      for (uint32_t j = 0; j < 8; ++j) set_gap(f, first, 8, j, 65535);  // sums past 2^16
      CHECK(decode_kind(frame_of(f), in) == FrameErrorKind::kCorrupt);
      f = good;
      set_gap(f, first, 8, 3, 0);  // a repeated position
      CHECK(decode_kind(frame_of(f), in) == FrameErrorKind::kCorrupt);
      f = good;
      set_gap(f, first, 8, 0, 0);  // a first gap of 0 is position 0: fine
      set_gap(f, first, 8, 1, gap(good, 0) + gap(good, 1));
      CHECK(decode_kind(frame_of(f), in) == std::nullopt);
      f = good;
      put<float>(f, block0, std::numeric_limits<float>::quiet_NaN());
      CHECK(decode_kind(frame_of(f), in) == FrameErrorKind::kNonFinite);
      f = good;
      put<float>(f, block0, -1.0f);
      CHECK(decode_kind(frame_of(f), in) == FrameErrorKind::kCorrupt);
      put<float>(f, block0, 1e38f);  // 2 · scale could overflow
      CHECK(decode_kind(frame_of(f), in) == FrameErrorKind::kCorrupt);
    }
    // A tensor's last block may be short (ln_1: 129 values in a 256-value block): its positions
    // are bounded by its own length.
    auto f = good;
    const TensorEntry& last_tensor = info.tensors[1];
    const uint64_t tail = last_tensor.numel % 256;
    REQUIRE(tail != 0);
    const uint64_t tail_index = last_tensor.numel / 256;  // its block within the tensor
    const GapAt tail_block{base + last_tensor.topk_at.lo + tail_index * 8,
                           base + last_tensor.topk_at.hi + tail_index * 8};
    set_gap(f, tail_block, 8, 0, static_cast<uint32_t>(tail));
    CHECK(decode_kind(f, in) == FrameErrorKind::kCorrupt);
    // The header's count: 0, or more than a block holds.
    f = good;
    put<uint32_t>(f, 36, 0);
    CHECK(decode_kind(f, in) == FrameErrorKind::kCorrupt);
    put<uint32_t>(f, 36, 257);
    CHECK(decode_kind(f, in) == FrameErrorKind::kCorrupt);
    put<uint32_t>(f, 36, 9);  // valid, but the tensors' byte ranges no longer add up
    CHECK(decode_kind(f, in) == FrameErrorKind::kCorrupt);
  }

  TEST_CASE("wrong names, shapes or counts are Mismatch") {
    const TensorSet in = model_like(7);
    const auto frame = make_frame(Codec::kInt4, 1, in);
    TensorSet t = in;
    t.names[1] = "transformer.h.0.ln_2.weight";
    CHECK(decode_kind(frame, t) == FrameErrorKind::kMismatch);
    t = in;
    t.shapes[0] = {33, 256};
    CHECK(decode_kind(frame, t) == FrameErrorKind::kMismatch);
    t = in;
    t.shapes[3] = {1};  // a scalar is not a 1-vector
    CHECK(decode_kind(frame, t) == FrameErrorKind::kMismatch);
    t = in;
    t.add("extra", {1}, {0});
    CHECK(decode_kind(frame, t) == FrameErrorKind::kMismatch);
    TensorSet dup;
    dup.add("x", {1}, {1});
    dup.add("x", {1}, {2});
    CHECK_THROWS_AS(Encoder(CodecConfig{}).encode(dup.inputs()), FrameError);
  }

  TEST_CASE("random byte edits of valid frames only ever throw FrameError") {
    const TensorSet in = model_like(8);
    std::mt19937 rng(99);
    size_t rejected = 0;
    for (const Codec codec : {Codec::kFp32, Codec::kBf16, Codec::kInt8, Codec::kInt4, Codec::kTopk}) {
      for (const int level : {0, 1}) {
        const auto good = make_frame(codec, level, in);
        for (int trial = 0; trial < 300; ++trial) {
          auto f = good;
          const int edits = 1 + static_cast<int>(rng() % 4);
          for (int k = 0; k < edits; ++k) f[rng() % f.size()] = static_cast<uint8_t>(rng());
          TensorSet out = in.like(0.0f);
          try {
            Decoder().decode(f, out.targets());
          } catch (const FrameError&) {
            ++rejected;
          }
        }
      }
    }
    MESSAGE(rejected << " of 3000 edited frames rejected");
  }

  // Payloads over the decoder's 8 MiB whole-buffer limit are decompressed one tensor at a time
  // in two passes (check, then write), and the encoder quantizes one tensor at a time into
  // zstd: neither holds a payload-sized buffer, and a bad frame still writes nothing.
  TEST_CASE("large zstd payloads stream per tensor: same values, no payload-sized buffer") {
    TensorSet in;
    for (int t = 0; t < 4; ++t) {
      in.add("layer" + std::to_string(t), {3, 1000 * 1000}, testing::heavy_tailed(3000000, 50 + t));
    }
    CodecConfig c;
    c.codec = Codec::kInt8;
    c.zstd_level = 1;
    c.error_feedback = false;  // residuals are tensor-sized by design
    std::vector<uint8_t> streamed;
    streamed.reserve(ZSTD_compressBound(13u << 20) + 4096);  // the frame is the caller's buffer
    testing::reset_largest_allocation();
    Encoder(c).encode(in.inputs(), streamed);
    const size_t encode_peak = testing::largest_allocation();
    const FrameInfo info = parse_frame(streamed.data(), streamed.size(), {});
    REQUIRE(info.zstd);
    REQUIRE(info.payload_bytes > (8u << 20));
    CHECK(encode_peak < (4u << 20));  // one 3M-element tensor, not the 12 MB payload

    c.zstd_level = 0;
    const auto raw = Encoder(c).encode(in.inputs());
    TensorSet want = in.like(0.0f), got = in.like(0.0f);
    Decoder().decode(raw, want.targets());
    Decoder dec;
    testing::reset_largest_allocation();
    dec.decode(streamed, got.targets());
    CHECK(testing::largest_allocation() < (4u << 20));
    CHECK(got.data == want.data);
    dec.decode_add(streamed, got.targets());
    for (size_t i = 0; i < 1000; ++i) REQUIRE(got.data[3][i] == want.data[3][i] + want.data[3][i]);

    // Flipped bytes at the start, middle and end (content checksum) of the stored payload:
    // Corrupt, and nothing written (decode_kind checks the targets), or harmless.
    for (const size_t at : {info.stored_offset + 40, info.stored_offset + info.stored_bytes / 2,
                            streamed.size() - 2}) {
      auto f = streamed;
      f[at] ^= 0x10;
      const auto kind = decode_kind(f, in);
      if (kind) {
        CHECK(*kind == FrameErrorKind::kCorrupt);
      } else {
        TensorSet out = in.like(0.0f);
        Decoder().decode(f, out.targets());
        CHECK(out.data == want.data);
      }
    }
    // A stored payload cut short inside (sizes patched to match) is Corrupt, nothing written.
    auto cut = streamed;
    cut.resize(cut.size() - info.stored_bytes / 3);
    put<uint64_t>(cut, kStoredBytesAt, info.stored_bytes - info.stored_bytes / 3);
    CHECK(decode_kind(cut, in) == FrameErrorKind::kCorrupt);
  }
}

}  // namespace
}  // namespace xloco::compress
