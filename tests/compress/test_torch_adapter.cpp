// The LibTorch adapter: a flat buffer cut by a FlatLayout in, the same values out, wrong
// buffers refused.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <doctest/doctest.h>

#include "compress/error.h"
#include "compress/torch_adapter.h"
#include "helpers.h"

namespace xloco::compress {
namespace {

at::Tensor filled(int64_t n, uint64_t seed) {
  at::Tensor t = at::empty({n}, at::kFloat);
  const auto values = testing::heavy_tailed(static_cast<size_t>(n), seed);
  std::copy(values.begin(), values.end(), t.data_ptr<float>());
  return t;
}

common::FlatLayout gpt_like() {
  common::FlatLayout layout;
  layout.append("transformer.wte.weight", {256, 128});
  layout.append("transformer.ln_f.bias", {128});
  return layout;
}

TEST_SUITE("torch_adapter") {
  TEST_CASE("a flat buffer cut by its layout round trips through a frame under the slot names") {
    const auto layout = gpt_like();
    CHECK(layout.numel == 256 * 128 + 128);
    CHECK(layout.slots[1].offset == 256 * 128);
    const at::Tensor params = filled(layout.numel, 1);
    CodecConfig config;
    config.codec = Codec::kFp32;
    Encoder enc(config);
    std::vector<uint8_t> frame;
    encode(enc, layout, params, frame);

    Decoder dec;
    const FrameInfo info = dec.inspect(frame.data(), frame.size());
    REQUIRE(info.tensors.size() == 2);
    CHECK(info.tensors[0].name == "transformer.wte.weight");
    CHECK(info.tensors[0].shape == Shape{256, 128});
    CHECK(info.tensors[1].name == "transformer.ln_f.bias");

    at::Tensor out = at::zeros({layout.numel}, at::kFloat);
    decode(dec, frame.data(), frame.size(), layout, out);
    CHECK(out.equal(params));
    decode_add(dec, frame.data(), frame.size(), layout, out);
    CHECK(out.equal(params.mul(2)));
  }

  TEST_CASE("non-contiguous, non-float, undefined or wrongly sized buffers are refused") {
    const auto layout = gpt_like();
    const auto expect_mismatch = [&](const at::Tensor& t, const char* what) {
      try {
        (void)const_refs(layout, t);
        FAIL("accepted");
      } catch (const FrameError& e) {
        CHECK(e.kind() == FrameErrorKind::kMismatch);
        CHECK(std::string(e.what()).find(what) != std::string::npos);
      }
    };
    expect_mismatch(filled(2 * layout.numel, 3).view({layout.numel, 2}).select(1, 0), "contiguous");
    expect_mismatch(at::zeros({layout.numel}, at::kDouble), "Double");
    expect_mismatch(at::Tensor(), "undefined");
    expect_mismatch(at::zeros({layout.numel - 1}, at::kFloat), "elements");
  }
}

}  // namespace
}  // namespace xloco::compress
