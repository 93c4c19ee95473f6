// Error feedback (design §2): what the receiver sums over rounds equals what the sender was
// given, minus the one residual still held back.
#include <doctest/doctest.h>

#include <cmath>

#include "compress/decoder.h"
#include "compress/encoder.h"
#include "compress/error.h"
#include "helpers.h"

namespace xloco::compress {
namespace {

using testing::heavy_tailed;
using testing::TensorSet;

constexpr int kRounds = 50;

struct Drift {
  double max_violation = 0;  // of the telescoping identity, in units of its tolerance
  double abs_error = 0;      // Σ|Σdeq − Σx| over elements
};

Drift run_rounds(Codec codec, bool feedback, uint32_t topk_bits = 2) {
  CodecConfig config;
  config.codec = codec;
  config.error_feedback = feedback;
  if (codec == Codec::kTopk) config.topk = 8;  // 1/32 of each 256-value block
  config.topk_bits = topk_bits;
  Encoder enc(config);
  Decoder dec;
  const size_t n = 3000;
  std::vector<double> sum_x(n), sum_deq(n), sum_abs(n);
  TensorSet in, out;
  in.add("w", {static_cast<int64_t>(n)}, {});
  out.add("w", {static_cast<int64_t>(n)}, std::vector<float>(n));
  for (int t = 0; t < kRounds; ++t) {
    in.data[0] = heavy_tailed(n, 1000 + t);
    const auto frame = enc.encode(in.inputs());
    dec.decode(frame, out.targets());
    const std::vector<float>* e = enc.residual("w");
    for (size_t i = 0; i < n; ++i) {
      sum_x[i] += in.data[0][i];
      sum_abs[i] += std::fabs(in.data[0][i]) + (e != nullptr ? 2 * std::fabs((*e)[i]) : 0.0);
      sum_deq[i] += out.data[0][i];
    }
  }
  const std::vector<float>* e = enc.residual("w");
  Drift d;
  for (size_t i = 0; i < n; ++i) {
    const double residual = e != nullptr ? (*e)[i] : 0.0;
    // Each round rounds x + e and (x + e) − deq once in fp32, so each adds at most 2^-24 of
    // |x| + 2|e| (summed in sum_abs) to the identity; 2^-22 leaves a factor 4 of margin.
    const double tol = std::ldexp(sum_abs[i], -22) + 1e-30;
    d.max_violation =
        std::max(d.max_violation, std::fabs(sum_deq[i] - (sum_x[i] - residual)) / tol);
    d.abs_error += std::fabs(sum_deq[i] - sum_x[i]);
  }
  return d;
}

TEST_SUITE("error_feedback") {
  TEST_CASE("sum of decoded frames = sum of inputs − final residual over 50 encodes") {
    for (const Codec codec : {Codec::kBf16, Codec::kInt8, Codec::kInt4, Codec::kTopk}) {
      CAPTURE(to_string(codec));
      CHECK(run_rounds(codec, true).max_violation <= 1.0);
    }
    CHECK(run_rounds(Codec::kTopk, true, 4).max_violation <= 1.0);  // topk at 4 bits
  }

  TEST_CASE("without feedback the quantization error accumulates instead") {
    for (const Codec codec : {Codec::kInt8, Codec::kInt4, Codec::kTopk}) {
      CAPTURE(to_string(codec));
      const Drift with = run_rounds(codec, true);
      const Drift without = run_rounds(codec, false);
      MESSAGE(to_string(codec) << ": Σ|Σdeq − Σx| with feedback " << with.abs_error << ", without "
                               << without.abs_error);
      // topk's fitted levels (issue 20) send the chosen values closely, so without feedback
      // it loses mostly what it never sends: 2.8x here, against 3x and more for the others.
      CHECK(with.abs_error * (codec == Codec::kTopk ? 2 : 3) < without.abs_error);
    }
    const Drift with4 = run_rounds(Codec::kTopk, true, 4), without4 = run_rounds(Codec::kTopk, false, 4);
    MESSAGE("topk at 4 bits: Σ|Σdeq − Σx| with feedback " << with4.abs_error << ", without "
                                                       << without4.abs_error);
    CHECK(with4.abs_error * 2 < without4.abs_error);
  }

  TEST_CASE("a residual put back into a new encoder continues the stream bit for bit") {
    // What a restarted provider does (outer/provider/provider.cpp): save residual(), restart, set_residual.
    CodecConfig config;
    config.codec = Codec::kInt8;
    Encoder first(config), twin(config);
    TensorSet a, b;
    a.add("w", {1000}, heavy_tailed(1000, 3));
    b.add("w", {1000}, heavy_tailed(1000, 4));
    first.encode(a.inputs());
    twin.encode(a.inputs());
    Encoder restarted(config);
    restarted.set_residual("w", *first.residual("w"));
    CHECK(restarted.encode(b.inputs()) == twin.encode(b.inputs()));
    Encoder fresh(config);  // without it the next frame differs: the residual was carried
    CHECK(fresh.encode(b.inputs()) != restarted.encode(b.inputs()) );

    CHECK_THROWS_AS(restarted.set_residual("w", {1.0f, std::nanf("")}), FrameError);
    config.codec = Codec::kFp32;
    Encoder exact(config);
    CHECK_THROWS_WITH_AS(exact.set_residual("w", {1.0f}), doctest::Contains("keeps none"), FrameError);
  }

  TEST_CASE("a decaying residual (SparseLoCo's beta): e' = (x + beta * e) - sent, exactly") {
    for (const Codec codec : {Codec::kTopk, Codec::kInt8}) {
      CAPTURE(to_string(codec));
      CodecConfig config;
      config.codec = codec;
      if (codec == Codec::kTopk) config.topk = 8;
      config.residual_decay = 0.75f;
      Encoder enc(config);
      Decoder dec;
      TensorSet in, out;
      in.add("w", {3000}, heavy_tailed(3000, 11));
      out.add("w", {3000}, std::vector<float>(3000));
      enc.encode(in.inputs());
      const std::vector<float> e = *enc.residual("w");
      in.data[0] = heavy_tailed(3000, 12);
      dec.decode(enc.encode(in.inputs()), out.targets());
      const std::vector<float>& next = *enc.residual("w");
      size_t wrong = 0;
      for (size_t i = 0; i < e.size(); ++i) {
        const float w = in.data[0][i] + 0.75f * e[i];
        wrong += next[i] != w - out.data[0][i] ? 1 : 0;
      }
      CHECK(wrong == 0);
    }
    CodecConfig bad;
    bad.residual_decay = 1.5f;
    CHECK_THROWS_WITH(Encoder{bad}, doctest::Contains("residual_decay"));
  }

  TEST_CASE("residuals: none for fp32, readable, resettable, shape-checked") {
    TensorSet in;
    in.add("a", {300}, heavy_tailed(300, 1));
    CodecConfig config;
    config.codec = Codec::kFp32;
    Encoder fp32(config);
    fp32.encode(in.inputs());
    CHECK(fp32.residual("a") == nullptr);

    config.codec = Codec::kInt4;
    Encoder enc(config);
    CHECK(enc.residual("a") == nullptr);
    enc.encode(in.inputs());
    const std::vector<float>* e = enc.residual("a");
    REQUIRE(e != nullptr);
    REQUIRE(e->size() == 300);
    double norm = 0;
    for (const float v : *e) norm += std::fabs(v);
    CHECK(norm > 0);
    enc.reset_residuals();
    for (const float v : *enc.residual("a")) CHECK(v == 0.0f);

    TensorSet other;
    other.add("a", {301}, heavy_tailed(301, 2));
    try {
      enc.encode(other.inputs());
      FAIL("shape change accepted");
    } catch (const FrameError& err) {
      CHECK(err.kind() == FrameErrorKind::kMismatch);
      CHECK(std::string(err.what()).find("'a'") != std::string::npos);
    }
  }
}

}  // namespace
}  // namespace xloco::compress
