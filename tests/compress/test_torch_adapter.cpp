// The LibTorch adapter: named at::Tensors in, the same values out, wrong tensors refused.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <doctest/doctest.h>

#include "compress/error.h"
#include "compress/torch_adapter.h"
#include "helpers.h"

namespace xloco::compress {
namespace {

at::Tensor filled(at::IntArrayRef shape, uint64_t seed) {
  at::Tensor t = at::empty(shape, at::kFloat);
  const auto values = testing::heavy_tailed(static_cast<size_t>(t.numel()), seed);
  std::copy(values.begin(), values.end(), t.data_ptr<float>());
  return t;
}

TEST_SUITE("torch_adapter") {
  TEST_CASE("named tensors round trip through a frame") {
    const NamedTensors params = {{"transformer.wte.weight", filled({256, 128}, 1)},
                                 {"transformer.ln_f.bias", filled({128}, 2)}};
    CodecConfig config;
    config.codec = Codec::kFp32;
    Encoder enc(config);
    std::vector<uint8_t> frame;
    encode(enc, params, frame);

    NamedTensors out = {{"transformer.wte.weight", at::zeros({256, 128}, at::kFloat)},
                        {"transformer.ln_f.bias", at::zeros({128}, at::kFloat)}};
    Decoder dec;
    decode(dec, frame.data(), frame.size(), out);
    for (size_t i = 0; i < params.size(); ++i) CHECK(out[i].second.equal(params[i].second));
    decode_add(dec, frame.data(), frame.size(), out);
    for (size_t i = 0; i < params.size(); ++i) {
      CHECK(out[i].second.equal(params[i].second.mul(2)));
    }
  }

  TEST_CASE("non-contiguous, non-float or undefined tensors are refused by name") {
    const auto expect_mismatch = [](const NamedTensors& t) {
      try {
        (void)const_refs(t);
        FAIL("accepted");
      } catch (const FrameError& e) {
        CHECK(e.kind() == FrameErrorKind::kMismatch);
        CHECK(std::string(e.what()).find("'w'") != std::string::npos);
      }
    };
    expect_mismatch({{"w", filled({4, 6}, 3).t()}});
    expect_mismatch({{"w", at::zeros({4}, at::kDouble)}});
    expect_mismatch({{"w", at::Tensor()}});
  }
}

}  // namespace
}  // namespace xloco::compress
