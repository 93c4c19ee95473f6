// Round trips per codec against the quantization bounds of issue 3, on heavy-tailed data.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "common/error.h"
#include "compress/decoder.h"
#include "compress/encoder.h"
#include "compress/error.h"
#include "compress/kernels.h"
#include "helpers.h"

namespace xloco::compress {
namespace {

using testing::heavy_tailed;
using testing::model_like;
using testing::TensorSet;

CodecConfig config_for(Codec codec, int zstd_level = 1, uint32_t block_size = 256) {
  CodecConfig c;
  c.codec = codec;
  c.zstd_level = zstd_level;
  c.block_size = block_size;
  return c;
}

TensorSet round_trip(const CodecConfig& config, const TensorSet& in) {
  Encoder enc(config);
  const std::vector<uint8_t> frame = enc.encode(in.inputs());
  TensorSet out = in.like(-7.0f);
  Decoder dec;
  dec.decode(frame, out.targets());
  return out;
}

// Checks |x − deq| ≤ absmax(block)/levels·(1/2) per element. The slack of 1e-4 relative covers
// float rounding of the scale and of its inverse (≤ 3 ulps of a value ≤ 127, i.e. ≤ 2.3e-5).
void check_block_bound(const TensorSet& in, const TensorSet& out, uint32_t block, double levels) {
  for (size_t t = 0; t < in.data.size(); ++t) {
    const auto& x = in.data[t];
    const auto& y = out.data[t];
    for (size_t start = 0; start < x.size(); start += block) {
      const size_t end = std::min(x.size(), start + block);
      double m = 0;
      for (size_t i = start; i < end; ++i) m = std::max(m, std::fabs(double{x[i]}));
      const double bound = m / (2 * levels) * (1 + 1e-4);
      for (size_t i = start; i < end; ++i) {
        const double err = std::fabs(double{x[i]} - double{y[i]});
        if (err > bound) {
          FAIL_CHECK(in.names[t] << "[" << i << "]: error " << err << " > bound " << bound);
          return;
        }
      }
    }
  }
}

TEST_SUITE("roundtrip") {
  TEST_CASE("fp32 round trip is bit-exact, raw and zstd") {
    TensorSet in = model_like(1);
    in.data[1][3] = -0.0f;
    in.data[1][4] = 1e-42f;  // subnormal
    in.data[1][5] = 3.4e38f;
    for (const int level : {0, 1, 3}) {
      const TensorSet out = round_trip(config_for(Codec::kFp32, level), in);
      for (size_t t = 0; t < in.data.size(); ++t) {
        REQUIRE(in.data[t].size() == out.data[t].size());
        const size_t bytes = 4 * in.data[t].size();
        CHECK((bytes == 0 || std::memcmp(in.data[t].data(), out.data[t].data(), bytes) == 0));
      }
    }
  }

  TEST_CASE("int8 error per element is at most absmax(block)/254") {
    const TensorSet in = model_like(2);
    for (const uint32_t block : {256u, 64u, 7u, 1u}) {
      for (const int level : {0, 1}) {
        CAPTURE(block);
        CAPTURE(level);
        check_block_bound(in, round_trip(config_for(Codec::kInt8, level, block), in), block, 127);
      }
    }
  }

  TEST_CASE("int4 error per element is at most absmax(block)/14") {
    const TensorSet in = model_like(3);
    for (const uint32_t block : {256u, 64u, 2u}) {
      for (const int level : {0, 1}) {
        CAPTURE(block);
        CAPTURE(level);
        check_block_bound(in, round_trip(config_for(Codec::kInt4, level, block), in), block, 7);
      }
    }
  }

  TEST_CASE("bf16 is round-to-nearest, within 2^-8 relative") {
    const TensorSet in = model_like(4, 1.0f);
    const TensorSet out = round_trip(config_for(Codec::kBf16), in);
    for (size_t t = 0; t < in.data.size(); ++t) {
      for (size_t i = 0; i < in.data[t].size(); ++i) {
        const float x = in.data[t][i];
        const float y = out.data[t][i];
        uint32_t b;
        std::memcpy(&b, &y, 4);
        // Nearest: the other bf16 neighbour on x's side is no closer.
        const bool away_from_zero = (x > y) == (y > 0.0f);
        const uint32_t other_bits = away_from_zero ? b + 0x10000u : b - 0x10000u;
        float other;
        std::memcpy(&other, &other_bits, 4);
        const double err = std::fabs(double{x} - y);
        if ((b & 0xffffu) != 0 || err > std::ldexp(std::fabs(double{x}), -8) ||
            (y != 0.0f && err > std::fabs(double{x} - other))) {
          FAIL_CHECK(in.names[t] << "[" << i << "]: " << x << " -> " << y);
          break;
        }
      }
    }
  }

  TEST_CASE("extreme values encode to frames that decode") {
    TensorSet in;
    in.add("huge", {4}, {9.2e36f, -9.2e36f, 1.0f, 0.0f});  // int4 encodes up to 7 · 2^120
    in.add("tiny", {3}, {1e-40f, -2e-38f, 0.0f});
    in.add("zeros", {5}, {0, 0, 0, 0, 0});
    for (const Codec codec : {Codec::kBf16, Codec::kInt8, Codec::kInt4}) {
      CAPTURE(to_string(codec));
      Encoder enc(config_for(codec));
      const auto frame = enc.encode(in.inputs());
      TensorSet out = in.like(0.0f);
      Decoder().decode(frame, out.targets());
      for (const auto& d : out.data) {
        for (const float v : d) CHECK(std::isfinite(v));
      }
      for (const auto& name : in.names) {
        for (const float e : *enc.residual(name)) CHECK(std::isfinite(e));
      }
      CHECK(out.data[2] == in.data[2]);
    }
  }

  TEST_CASE("values beyond a codec's range are OverLimit, naming tensor and element") {
    TensorSet in;
    in.add("w", {3}, {1.0f, -3.0e38f, 0.0f});
    CHECK_NOTHROW(Encoder(config_for(Codec::kBf16)).encode(in.inputs()));
    for (const Codec codec : {Codec::kInt8, Codec::kInt4}) {
      try {
        Encoder(config_for(codec)).encode(in.inputs());
        FAIL("accepted");
      } catch (const FrameError& e) {
        CHECK(e.kind() == FrameErrorKind::kOverLimit);
        CHECK(std::string(e.what()).find("'w' (#0): element 1") != std::string::npos);
      }
    }
  }

  TEST_CASE("zstd and raw frames decode to the same values; raw is chosen when zstd does not pay") {
    const TensorSet in = model_like(5);
    const TensorSet raw = round_trip(config_for(Codec::kInt8, 0), in);
    const TensorSet z = round_trip(config_for(Codec::kInt8, 3), in);
    CHECK(raw.data == z.data);

    Encoder enc(config_for(Codec::kInt8, 1));
    enc.encode(in.inputs());
    CHECK(enc.last_stats().zstd);  // heavy-tailed int8 codes compress (~0.8)
    TensorSet noise;
    std::vector<float> v(4096);
    std::mt19937 rng(9);
    for (auto& x : v) x = std::uniform_real_distribution<float>(-1, 1)(rng);
    noise.add("noise", {4096}, v);
    Encoder uniform(config_for(Codec::kInt8, 1));
    uniform.encode(noise.inputs());
    CHECK_FALSE(uniform.last_stats().zstd);  // uniform int8 codes carry 8 bits each
    CHECK(uniform.last_stats().frame_bytes ==
          uniform.last_stats().payload_bytes + kHeaderBytes + 2 + 5 + 1 + 8 + 16);
  }

  TEST_CASE("decode_add adds the dequantized frame to the targets") {
    const TensorSet in = model_like(6);
    for (const Codec codec : {Codec::kFp32, Codec::kBf16, Codec::kInt8, Codec::kInt4}) {
      CAPTURE(to_string(codec));
      const auto frame = Encoder(config_for(codec)).encode(in.inputs());
      TensorSet assigned = in.like(0.0f);
      Decoder dec;
      dec.decode(frame, assigned.targets());
      TensorSet added = in.like(0.5f);
      dec.decode_add(frame, added.targets());
      bool exact = true;
      for (size_t t = 0; t < in.data.size(); ++t) {
        for (size_t i = 0; i < in.data[t].size(); ++i) {
          exact = exact && added.data[t][i] == 0.5f + assigned.data[t][i];
        }
      }
      CHECK(exact);
    }
  }

  TEST_CASE("norm is the L2 norm of the decoded values, without decoding them, and checks the frame as decode does") {
    TensorSet big;  // over 8 MiB of payload in fp32: the streamed path
    std::vector<float> v(3u << 20);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 97) * 1e-3f;
    big.add("big", {static_cast<int64_t>(v.size())}, v);
    const TensorSet small = model_like(7);
    for (const TensorSet* in : std::initializer_list<const TensorSet*>{&small, &big}) {
      for (const Codec codec : {Codec::kFp32, Codec::kBf16, Codec::kInt8, Codec::kInt4}) {
        CAPTURE(to_string(codec));
        const auto frame = Encoder(config_for(codec)).encode(in->inputs());
        TensorSet out = in->like(0.0f);
        Decoder dec;
        dec.decode(frame, out.targets());
        double sum = 0;
        for (const auto& t : out.data) {
          for (const float x : t) sum += static_cast<double>(x) * x;
        }
        // Exact q·scale in double against the decoder's fp32 rounding of each value.
        CHECK(dec.norm(frame.data(), frame.size()) == doctest::Approx(std::sqrt(sum)).epsilon(1e-6));
        auto bad = frame;
        bad.pop_back();  // truncated: refused as decode() refuses it
        CHECK_THROWS_AS(dec.norm(bad.data(), bad.size()), FrameError);
      }
    }
  }

  TEST_CASE("dequantization matches the scalar formula bit for bit") {
    // The vectorized loops must compute exactly float(q) * scale (and out + that), with no
    // contraction, or replicas on different machines would drift apart.
    const uint32_t block = 64;
    const uint64_t n = 1000;
    const uint64_t blocks = (n + block - 1) / block;
    std::mt19937 rng(11);
    for (const Codec codec : {Codec::kInt8, Codec::kInt4}) {
      std::vector<uint8_t> payload(tensor_payload_bytes(codec, n, block));
      for (auto& b : payload) b = static_cast<uint8_t>(rng());
      std::vector<float> scales(blocks);
      for (auto& s : scales) s = std::uniform_real_distribution<float>(0, 1e-2f)(rng);
      std::memcpy(payload.data(), scales.data(), 4 * blocks);
      std::vector<float> base(n), out(n), sum(n);
      for (auto& v : base) v = std::uniform_real_distribution<float>(-1, 1)(rng);
      sum = base;
      kernels::decode(codec, payload.data(), n, block, out.data(), false);
      kernels::decode(codec, payload.data(), n, block, sum.data(), true);
      for (uint64_t i = 0; i < n; ++i) {
        const uint8_t* q = payload.data() + 4 * blocks;
        const int code = codec == Codec::kInt8 ? static_cast<int8_t>(q[i])
                                               : ((q[i / 2] >> (4 * (i % 2))) & 15) - 8;
        volatile float product = static_cast<float>(code) * scales[i / block];
        volatile float added = base[i] + product;
        if (out[i] != product || sum[i] != added) {
          FAIL_CHECK(to_string(codec) << " element " << i);
          break;
        }
      }
    }
  }

  TEST_CASE("wire ratios on heavy-tailed data") {
    TensorSet in;
    in.add("g", {1 << 16}, heavy_tailed(1 << 16, 12));
    const double fp32_bytes = 4.0 * (1 << 16);
    for (const int level : {0, 1}) {
      CAPTURE(level);
      CHECK(Encoder(config_for(Codec::kInt8, level)).encode(in.inputs()).size() / fp32_bytes <=
            0.27);
      CHECK(Encoder(config_for(Codec::kInt4, level)).encode(in.inputs()).size() / fp32_bytes <=
            0.14);
    }
  }

  TEST_CASE("codec names and config validation") {
    for (const Codec c : {Codec::kFp32, Codec::kBf16, Codec::kInt8, Codec::kInt4}) {
      CHECK(parse_codec(to_string(c)) == c);
    }
    CHECK_THROWS_AS(parse_codec("int2"), common::ConfigError);
    CodecConfig c;
    c.block_size = 0;
    CHECK_THROWS_AS(Encoder{c}, common::ConfigError);
    c.block_size = 255;
    c.codec = Codec::kInt4;
    CHECK_THROWS_AS(Encoder{c}, common::ConfigError);
    c.codec = Codec::kInt8;
    CHECK_NOTHROW(Encoder{c});
    c.zstd_level = 1000;
    CHECK_THROWS_AS(Encoder{c}, common::ConfigError);
    Limits l;
    l.max_payload_bytes = ~0ull;
    CHECK_THROWS_AS(Decoder{l}, common::ConfigError);
  }

  TEST_CASE("multi-threaded zstd gives a frame that decodes the same") {
    TensorSet in;
    in.add("g", {1 << 18}, heavy_tailed(1 << 18, 13));
    CodecConfig c = config_for(Codec::kInt8);
    const TensorSet single = round_trip(c, in);
    c.zstd_threads = 2;
    CHECK(round_trip(c, in).data == single.data);
  }
}

}  // namespace
}  // namespace xloco::compress
