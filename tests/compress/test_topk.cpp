// The topk codec: per block the k largest |x| at 2 bits (or 4), positions as u16 gaps (issue 20).
// What is sent is exactly the brute-force top k; values are within their 2-bit (4-bit) bound;
// sizes are the formula's; bytes are deterministic.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "common/error.h"
#include "compress/decoder.h"
#include "compress/encoder.h"
#include "compress/error.h"
#include "compress/frame.h"
#include "helpers.h"

namespace xloco::compress {
namespace {

using testing::heavy_tailed;
using testing::model_like;
using testing::TensorSet;

CodecConfig topk_config(uint32_t block, uint32_t k, int zstd_level = 1, uint32_t bits = 2) {
  CodecConfig c;
  c.codec = Codec::kTopk;
  c.block_size = block;
  c.topk = k;
  c.topk_bits = bits;
  c.zstd_level = zstd_level;
  return c;
}

// Positions of the k largest |x| of x[start, start + len), ties to the lower position.
std::vector<uint64_t> brute_topk(const std::vector<float>& x, uint64_t start, uint32_t len,
                                 uint32_t k) {
  std::vector<uint64_t> idx(len);
  std::iota(idx.begin(), idx.end(), start);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](uint64_t a, uint64_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  idx.resize(std::min(k, len));
  std::sort(idx.begin(), idx.end());
  return idx;
}

// 70001 heavy-tailed values with ties (every 97th equals its neighbour) and a run of zeros.
std::vector<float> topk_input(uint64_t seed) {
  auto x = heavy_tailed(70001, seed);
  for (size_t i = 0; i < x.size(); i += 97) x[i] = x[i + 1];  // ties
  for (size_t i = 300; i < 340; ++i) x[i] = 0.0f;             // zeros
  return x;
}

// Size of a raw frame of topk_input as the one tensor "x": header, its table entry (name length,
// name, rank, one dimension, offset, bytes), payload.
uint64_t topk_input_frame_bytes(uint32_t block, uint32_t k, uint32_t bits) {
  return kHeaderBytes + 2 + 1 + 1 + 8 + 16 + tensor_payload_bytes(Codec::kTopk, 70001, block, k, bits);
}

TEST_SUITE("topk") {
  TEST_CASE("sends exactly the top k of every block, each within its 2-bit bound") {
    for (const auto& [block, k] : {std::pair<uint32_t, uint32_t>{256, 8}, {4096, 64}, {100, 3},
                                  {7, 7}, {65536, 1024}}) {
      double total_sse = 0, total_sse_absmax = 0;
      CAPTURE(block);
      CAPTURE(k);
      TensorSet in;
      const auto x = topk_input(5 + block);
      in.add("x", {70001}, x);
      const auto out_set = [&] {
        Encoder enc(topk_config(block, k, 0));
        const auto frame = enc.encode(in.inputs());
        CHECK(frame.size() == topk_input_frame_bytes(block, k, 2));
        TensorSet out = in.like(-7.0f);
        Decoder().decode(frame, out.targets());
        return out;
      }();
      const auto& y = out_set.data[0];
      for (uint64_t start = 0; start < x.size(); start += block) {
        const auto len = static_cast<uint32_t>(std::min<uint64_t>(block, x.size() - start));
        const auto want = brute_topk(x, start, len, k);
        float absmax = 0;
        for (uint64_t i = start; i < start + len; ++i) absmax = std::max(absmax, std::fabs(x[i]));
        std::vector<bool> sent(len, false);
        for (const uint64_t i : want) sent[i - start] = true;
        // Two levels per block, s and 2s (s fitted to the sent values): every sent value is
        // ±s or ±2s with x's sign, and the block's squared error is at most that of the levels
        // absmax/2 and absmax (the rule before the fit), each value at its nearer level.
        double lo = INFINITY, hi = 0, sse = 0, sse_absmax = 0;
        for (uint64_t i = start; i < start + len; ++i) {
          if (!sent[i - start]) {
            if (y[i] != 0.0f) FAIL_CHECK("unsent value " << i << " decoded as " << y[i]);
            continue;
          }
          if (std::fabs(x[i]) > 0 && std::signbit(x[i]) != std::signbit(y[i])) {
            FAIL_CHECK("value " << i << ": " << x[i] << " decoded as " << y[i]);
          }
          lo = std::min(lo, double{std::fabs(y[i])});
          hi = std::max(hi, double{std::fabs(y[i])});
          sse += (double{x[i]} - y[i]) * (double{x[i]} - y[i]);
          const double m = std::fabs(x[i]), half = absmax / 2.0;
          const double level = m >= 1.5 * half ? absmax : half;
          sse_absmax += (m - level) * (m - level);
        }
        if (absmax == 0) continue;
        for (uint64_t i = start; i < start + len; ++i) {
          const double v = std::fabs(y[i]);
          if (sent[i - start] && v != lo && v != hi) FAIL_CHECK("value " << i << ": a third level " << v);
        }
        if (hi != lo && hi != 2 * lo) FAIL_CHECK("block at " << start << ": levels " << lo << ", " << hi);
        if (!(sse <= sse_absmax * (1 + 1e-5) + 1e-30)) {
          FAIL_CHECK("block at " << start << ": squared error " << sse << " above the absmax rule's " << sse_absmax);
        }
        total_sse += sse;
        total_sse_absmax += sse_absmax;
      }
      // The fit moves the levels to the sent values: on heavy-tailed data it is well below
      // the absmax rule's error wherever a block sends more than a handful of values.
      MESSAGE("block " << block << ", k " << k << ": squared error " << total_sse << " (fitted) vs "
                       << total_sse_absmax << " (absmax / 2)");
      if (k >= 8) CHECK(total_sse < 0.9 * total_sse_absmax);
    }
  }

  TEST_CASE("the payload's four sections: each tensor's place in scales, gap bytes and codes") {
    // Two blocks and a tail of 100 (k 100), then a tensor of 50 (k 50): 326 values, 3 blocks.
    const auto at = topk_places({4096 + 100, 50}, 4096, 176, 2);
    REQUIRE(at.size() == 2);
    CHECK(at[0].scales == 0);
    CHECK(at[1].scales == 8);
    CHECK(at[0].lo == 12);
    CHECK(at[1].lo == 12 + 276);
    CHECK(at[0].hi == 12 + 326);
    CHECK(at[1].hi == 12 + 326 + 276);
    CHECK(at[0].codes == 12 + 2 * 326);
    CHECK(at[1].codes == 12 + 2 * 326 + 44 + 25);  // ceil(176 / 4), ceil(100 / 4)
    // The sections end where the tensors' table ranges do: 13 code bytes for the last 50.
    CHECK(at[1].codes + 13 == tensor_payload_bytes(Codec::kTopk, 4096 + 100, 4096, 176) +
                                  tensor_payload_bytes(Codec::kTopk, 50, 4096, 176));
    const auto at4 = topk_places({4096 + 100, 50}, 4096, 176, 4);
    CHECK(at4[1].codes == 12 + 2 * 326 + 88 + 50);
  }

  TEST_CASE("4-bit values: the same positions, every value ±m·s (m = 1..8) at its nearer level, far closer than 2 bits") {
    for (const auto& [block, k] : {std::pair<uint32_t, uint32_t>{4096, 176}, {256, 8}, {100, 3},
                                  {7, 7}}) {
      CAPTURE(block);
      CAPTURE(k);
      TensorSet in;
      const auto x = topk_input(9 + block);
      in.add("x", {70001}, x);
      const auto decoded = [&](uint32_t bits, std::vector<uint8_t>* frame_out) {
        const auto frame = Encoder(topk_config(block, k, 0, bits)).encode(in.inputs());
        CHECK(frame.size() == topk_input_frame_bytes(block, k, bits));
        const FrameInfo info = parse_frame(frame.data(), frame.size(), Limits{});
        CHECK(info.topk_bits == bits);
        CHECK(((frame[7] & kFlagTopk4) != 0) == (bits == 4));
        TensorSet out = in.like(-7.0f);
        Decoder dec;
        dec.decode(frame, out.targets());
        double ss = 0;
        for (const float v : out.data[0]) ss += double{v} * v;
        CHECK(dec.norm(frame.data(), frame.size()) == doctest::Approx(std::sqrt(ss)).epsilon(1e-6));
        if (frame_out != nullptr) *frame_out = frame;
        return out.data[0];
      };
      std::vector<uint8_t> frame4;
      const auto y4 = decoded(4, &frame4);
      const auto y2 = decoded(2, nullptr);
      CHECK(tensor_payload_bytes(Codec::kTopk, 4096, 4096, 176, 4) ==
            4 + 2 * 176 + 88);  // scale, gaps, one nibble a value
      double sse4 = 0, sse2 = 0;
      const FrameInfo info4 = parse_frame(frame4.data(), frame4.size(), Limits{});
      // The scales' section (frame.h), read from the raw frame (no zstd): one f32 per block.
      uint64_t record = info4.stored_offset + info4.tensors[0].topk_at.scales;
      for (uint64_t start = 0; start < x.size(); start += block) {
        const auto len = static_cast<uint32_t>(std::min<uint64_t>(block, x.size() - start));
        const auto want = brute_topk(x, start, len, k);
        std::vector<bool> sent(len, false);
        for (const uint64_t i : want) sent[i - start] = true;
        float s = 0;
        std::memcpy(&s, frame4.data() + record, 4);
        record += 4;
        for (uint64_t i = start; i < start + len; ++i) {
          if (!sent[i - start]) {
            if (y4[i] != 0.0f) FAIL_CHECK("unsent value " << i << " decoded as " << y4[i]);
            continue;
          }
          if (std::fabs(x[i]) > 0 && std::signbit(x[i]) != std::signbit(y4[i])) {
            FAIL_CHECK("value " << i << ": " << x[i] << " decoded as " << y4[i]);
          }
          sse4 += (double{x[i]} - y4[i]) * (double{x[i]} - y4[i]);
          sse2 += (double{x[i]} - y2[i]) * (double{x[i]} - y2[i]);
          if (s == 0) continue;  // an all-zero selection
          // ±m·s, m the nearer of 1..8 to |x|/s.
          const double want_m = std::clamp(std::floor(std::fabs(x[i]) / s + 0.5), 1.0, 8.0);
          if (std::fabs(std::fabs(y4[i]) / s - want_m) > 1e-5) {
            FAIL_CHECK("value " << i << ": " << x[i] << " sent as " << y4[i] << ", level "
                                << std::fabs(y4[i]) / s << " of s " << s << ", nearer " << want_m);
          }
        }
      }
      MESSAGE("block " << block << ", k " << k << ": squared error of the sent values, 4 bits "
                       << sse4 << ", 2 bits " << sse2);
      if (k >= 8) CHECK(sse4 < 0.5 * sse2);  // 3x to 22x here
      // Every code is a value: a 4-bit frame read as 2-bit is refused by its size, not misread.
      auto f = frame4;
      f[7] = static_cast<uint8_t>(f[7] & ~kFlagTopk4);
      TensorSet out = in.like(0.0f);
      CHECK_THROWS_AS(Decoder().decode(f, out.targets()), FrameError);
    }
  }

  TEST_CASE("topk: a block near the largest encodable value still decodes (the fitted scale stays within the decoder's bound)") {
    // One value at 2^121 (the encoder's limit) and seven at 0.74 of it: the least-squares scale
    // would be ~1.3 · 2^120, above what a frame may declare; the encoder keeps absmax / 2.
    std::vector<float> x(8, 0.74f * std::ldexp(1.0f, 121));
    x[3] = std::ldexp(1.0f, 121);
    TensorSet in;
    in.add("x", {8}, x);
    Encoder enc(topk_config(8, 8, 0));
    const auto frame = enc.encode(in.inputs());
    TensorSet out = in.like(0.0f);
    REQUIRE_NOTHROW(Decoder().decode(frame, out.targets()));
    CHECK(out.data[0][3] == std::ldexp(1.0f, 121));
  }

  TEST_CASE("the selection is exact whatever its sample sees (fallback, ties, zeros, a low threshold)") {
    // The encoder guesses a threshold from every (block / 128)-th value and falls back to lower
    // ones when fewer than k values reach it. Blocks built against that guess: the positions
    // sent, read from the raw frame, are the brute-force top k (ties to the lower position).
    constexpr uint32_t kBlock = 4096, kK = 64;
    const auto sign = [](uint32_t i) { return i % 3 == 0 ? -1.0f : 1.0f; };
    std::vector<std::pair<std::string, std::vector<float>>> blocks;
    {  // the sampled positions hold the 128 largest: the first four guesses gather < k
      std::vector<float> x(kBlock);
      for (uint32_t i = 0; i < kBlock; ++i) x[i] = sign(i) * (i % 32 == 0 ? 1000.0f + i : 1.0f + i % 7);
      blocks.emplace_back("sampled values largest", x);
    }
    {  // the sampled positions hold the smallest: the guess gathers the whole block
      std::vector<float> x(kBlock);
      for (uint32_t i = 0; i < kBlock; ++i) x[i] = sign(i) * (i % 32 == 0 ? 1e-3f : 1.0f + (i * 7919u) % 4096u);
      blocks.emplace_back("sampled values smallest", x);
    }
    blocks.emplace_back("all equal", std::vector<float>(kBlock, -2.5f));
    blocks.emplace_back("all zero", std::vector<float>(kBlock, 0.0f));
    {  // 30 at 10, 100 at 5 (the k-th value is a tie), the rest at 1
      std::vector<float> x(kBlock, 1.0f);
      for (uint32_t j = 0; j < 30; ++j) x[(j * 131u + 7u) % kBlock] = sign(j) * 10.0f;
      for (uint32_t j = 0; j < 100; ++j) x[(j * 37u + 1000u) % kBlock] = sign(j) * 5.0f;
      blocks.emplace_back("ties at the k-th value", x);
    }
    {  // a few huge values and a plain heavy-tailed rest
      auto x = heavy_tailed(kBlock, 77);
      for (uint32_t j = 0; j < 5; ++j) x[j * 800u + 3u] = 1e30f;
      blocks.emplace_back("heavy-tailed, five huge", x);
    }
    for (const auto& [what, x] : blocks) {
      CAPTURE(what);
      TensorSet in;
      in.add("x", {kBlock}, x);
      const auto frame = Encoder(topk_config(kBlock, kK, 0)).encode(in.inputs());
      const uint64_t payload = frame.size() - tensor_payload_bytes(Codec::kTopk, kBlock, kBlock, kK);
      // One block: scale, then the gaps' low bytes, their high bytes, the codes (frame.h).
      const TopkAt at = parse_frame(frame.data(), frame.size(), Limits{}).tensors[0].topk_at;
      REQUIRE(at.lo == 4);
      REQUIRE(at.hi == 4 + kK);
      std::vector<uint64_t> sent(kK);
      for (uint64_t j = 0, p = 0; j < kK; ++j) {
        p += frame[payload + at.lo + j] | uint64_t{frame[payload + at.hi + j]} << 8;
        sent[j] = p;
      }
      CHECK(sent == brute_topk(x, 0, kBlock, kK));
    }
  }

  TEST_CASE("same input, same bytes; decode_add adds; sum of squares matches the values") {
    const TensorSet in = model_like(21);
    const auto config = topk_config(256, 16);
    const auto a = Encoder(config).encode(in.inputs());
    CHECK(Encoder(config).encode(in.inputs()) == a);
    TensorSet once = in.like(0.0f), twice = in.like(1.0f);
    Decoder dec;
    dec.decode(a, once.targets());
    dec.decode_add(a, twice.targets());
    double ss = 0;
    for (size_t t = 0; t < once.data.size(); ++t) {
      for (size_t i = 0; i < once.data[t].size(); ++i) {
        CHECK(twice.data[t][i] == 1.0f + once.data[t][i]);
        ss += double{once.data[t][i]} * once.data[t][i];
      }
    }
    CHECK(dec.norm(a.data(), a.size()) == doctest::Approx(std::sqrt(ss)).epsilon(1e-9));
  }

  // Decoder::for_each_block (the relay's sparse read of a frame): every block of every tensor in
  // order, a topk block's sent values only, at increasing positions, the same floats decode()
  // writes; a dense codec's every element; a hostile frame refused before anything is visited.
  TEST_CASE("for_each_block: each block in order with exactly the values decode writes, sparse for topk") {
    const TensorSet in = model_like(23);
    for (const bool topk : {true, false}) {
      CAPTURE(topk);
      CodecConfig config = topk ? topk_config(64, 5, 1, 4) : CodecConfig{};
      if (!topk) {
        config.codec = Codec::kInt8;
        config.block_size = 64;
      }
      const auto frame = Encoder(config).encode(in.inputs());
      TensorSet dense = in.like(0.0f), visited = in.like(0.0f);
      Decoder dec;
      dec.decode(frame, dense.targets());
      std::vector<size_t> blocks(in.names.size(), 0);
      size_t values = 0;
      size_t last_tensor = 0;
      dec.for_each_block(frame.data(), frame.size(), visited.targets(),
                         [&](size_t t, const BlockValues& b) {
                           CHECK(t >= last_tensor);  // table order
                           last_tensor = t;
                           CHECK(b.start == 64 * blocks[t]);  // each block, in order
                           ++blocks[t];
                           CHECK(b.len == std::min<uint64_t>(64, in.data[t].size() - b.start));
                           CHECK(b.n == (topk ? std::min<uint32_t>(5, b.len) : b.len));
                           CHECK((b.pos != nullptr) == topk);
                           for (uint32_t j = 0; j < b.n; ++j) {
                             const uint32_t p = b.pos != nullptr ? b.pos[j] : j;
                             if (j > 0 && b.pos != nullptr) CHECK(p > b.pos[j - 1]);
                             REQUIRE(p < b.len);
                             visited.data[t][b.start + p] = b.value[j];
                             ++values;
                           }
                         });
      for (size_t t = 0; t < in.names.size(); ++t) {
        CAPTURE(in.names[t]);
        CHECK(blocks[t] == (in.data[t].size() + 63) / 64);
        CHECK(std::memcmp(visited.data[t].data(), dense.data[t].data(), 4 * dense.data[t].size()) == 0);
      }
      size_t elements = 0, sendable = 0;  // every element; at most 5 of each block of 64
      for (const auto& d : in.data) {
        elements += d.size();
        for (size_t at = 0; at < d.size(); at += 64) sendable += std::min<size_t>(5, d.size() - at);
      }
      CHECK(values == (topk ? sendable : elements));
      // A position repeated (a zero gap after the first): refused before any block is visited.
      if (topk) {
        const auto plain = Encoder(topk_config(64, 5, 0, 4)).encode(in.inputs());  // raw payload
        const FrameInfo info = parse_frame(plain.data(), plain.size(), Limits{});
        auto bad = plain;
        const TopkAt& at0 = info.tensors[0].topk_at;
        bad[info.stored_offset + at0.lo + 1] = 0;  // gap 1 of the first block: 0
        bad[info.stored_offset + at0.hi + 1] = 0;
        Decoder raw;
        int seen = 0;
        CHECK_THROWS_AS(raw.for_each_block(bad.data(), bad.size(), visited.targets(),
                                           [&](size_t, const BlockValues&) { ++seen; }),
                        FrameError);
        CHECK(seen == 0);
      }
    }
  }

  TEST_CASE("bytes: 1/64 of each 4096-value block is ~110x smaller than fp32 before zstd") {
    TensorSet in;
    in.add("w", {1 << 20}, heavy_tailed(1 << 20, 3));
    Encoder enc(topk_config(4096, 64, 0));
    const auto frame = enc.encode(in.inputs());
    const double ratio = 4.0 * (1 << 20) / static_cast<double>(frame.size());
    MESSAGE("topk 64/4096, no zstd: " << ratio << "x fewer bytes than fp32");
    CHECK(ratio > 100);
    CHECK(ratio < 120);
    Encoder zstd(topk_config(4096, 64, 1));
    CHECK(zstd.encode(in.inputs()).size() <= frame.size());
  }

  TEST_CASE("configs the frame cannot carry are refused") {
    CHECK_THROWS_AS(validate(topk_config(1 << 17, 64)), common::ConfigError);
    CHECK_THROWS_AS(validate(topk_config(256, 0)), common::ConfigError);
    CHECK_THROWS_AS(validate(topk_config(256, 257)), common::ConfigError);
    CHECK_NOTHROW(validate(topk_config(1 << 16, 1 << 16)));
    CHECK_NOTHROW(validate(topk_config(256, 8, 1, 4)));
    CHECK_THROWS_AS(validate(topk_config(256, 8, 1, 3)), common::ConfigError);
    CHECK_THROWS_AS(validate(topk_config(256, 8, 1, 8)), common::ConfigError);
    CHECK(parse_codec("topk") == Codec::kTopk);
  }
}

}  // namespace
}  // namespace xloco::compress
