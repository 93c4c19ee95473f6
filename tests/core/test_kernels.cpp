// The fused CPU kernels (src/inner/kernels.h) against LibTorch's ops, values and gradients, and
// the choice of OpenBLAS kernels (src/inner/blas_core.h) as the pure rule it is.
#include "doctest_torch.h"

#include "helpers.h"

#include "common/config.h"
#include "inner/blas_core.h"
#include "inner/kernels.h"
#include "inner/model.h"

using namespace xloco;

namespace {

// y and d(Σ y∘w)/d qkv through one attention function.
std::pair<torch::Tensor, torch::Tensor> attention_and_grad(
    torch::Tensor (*fn)(const torch::Tensor&, int64_t), const torch::Tensor& qkv0,
    const torch::Tensor& w, int64_t heads) {
  auto qkv = qkv0.clone().requires_grad_(true);
  auto y = fn(qkv, heads);
  (y * w).sum().backward();
  return {y.detach(), qkv.grad()};
}

double max_rel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item<double>();
}

}  // namespace

TEST_SUITE("kernels") {
  TEST_CASE("fused causal attention = LibTorch's ops, forward and backward, to fp32 tolerance") {
    struct Case {
      int64_t B, T, C, H;
      double spread;  // scale of q, k, v: large values test the softmax's max subtraction
    };
    // T = 128 (the tiny GPT), T past one 64-row block and not a multiple of it, T = 1, one head
    // of 64, odd head counts, and logits in the hundreds.
    for (const Case c : {Case{2, 128, 128, 4, 1.0}, Case{1, 130, 96, 3, 1.0}, Case{3, 1, 16, 2, 1.0},
                         Case{1, 200, 64, 1, 1.0}, Case{2, 65, 48, 3, 8.0}, Case{1, 64, 32, 2, 30.0}}) {
      CAPTURE(c.B);
      CAPTURE(c.T);
      CAPTURE(c.C);
      CAPTURE(c.H);
      CAPTURE(c.spread);
      torch::manual_seed(7);
      const auto qkv = torch::randn({c.B, c.T, 3 * c.C}) * c.spread;
      const auto w = torch::randn({c.B, c.T, c.C});
      REQUIRE(inner::fused_attention_available(qkv));
      const auto [y, g] = attention_and_grad(&inner::causal_attention, qkv, w, c.H);
      const auto [y_aten, g_aten] = attention_and_grad(&inner::causal_attention_aten, qkv, w, c.H);
      // Both against LibTorch's ops in float64: the fused kernel's error is fp32 rounding, no
      // larger than that of LibTorch's own float32 ops (plus one part in 10^6).
      const auto [y64, g64] = attention_and_grad(&inner::causal_attention_aten,
                                                 qkv.to(torch::kFloat64), w.to(torch::kFloat64), c.H);
      const double ey = max_rel(y.to(torch::kFloat64), y64), ey_aten = max_rel(y_aten.to(torch::kFloat64), y64);
      const double eg = max_rel(g.to(torch::kFloat64), g64), eg_aten = max_rel(g_aten.to(torch::kFloat64), g64);
      CAPTURE(ey);
      CAPTURE(ey_aten);
      CAPTURE(eg);
      CAPTURE(eg_aten);
      CHECK(ey <= 2 * ey_aten + 1e-6);
      CHECK(eg <= 2 * eg_aten + 1e-6);
      if (c.spread <= 8) {  // at logits in the hundreds float32 itself is off by ~3e-4 (both ways)
        CHECK(ey < 1e-5);
        CHECK(eg < 1e-4);
      }
      CHECK(torch::isfinite(g).all().item<bool>());
    }
  }

  TEST_CASE("causal: changing a later token changes neither the output nor the gradient before it") {
    torch::manual_seed(3);
    auto qkv = torch::randn({1, 100, 3 * 32});
    auto changed = qkv.clone();
    changed.narrow(1, 70, 30).normal_();
    const auto y = inner::causal_attention(qkv, 2), y2 = inner::causal_attention(changed, 2);
    CHECK(torch::equal(y.narrow(1, 0, 70), y2.narrow(1, 0, 70)));
    CHECK_FALSE(torch::equal(y.narrow(1, 70, 30), y2.narrow(1, 70, 30)));
  }

  TEST_CASE("inputs the kernel does not take (float64, non-contiguous) fall back to LibTorch's ops") {
    torch::manual_seed(5);
    const auto qkv = torch::randn({2, 40, 3 * 32}, torch::kFloat64);
    CHECK_FALSE(inner::fused_attention_available(qkv));
    CHECK(torch::allclose(inner::causal_attention(qkv, 4), inner::causal_attention_aten(qkv, 4)));
    const auto strided = torch::randn({2, 3 * 32, 40}).transpose(1, 2);
    CHECK_FALSE(inner::fused_attention_available(strided));
    CHECK(torch::allclose(inner::causal_attention(strided, 4), inner::causal_attention_aten(strided, 4)));
    CHECK_THROWS(inner::causal_attention(torch::randn({2, 40, 3 * 30}), 4));  // 30 % 4 != 0
  }

  TEST_CASE("the tiny GPT with run.kernels = fused and = aten: same loss and gradients from the same init") {
    auto config = common::Config{};
    config.model.vocab_size = 256;
    config.model.d_model = 64;
    config.model.n_layer = 2;
    config.model.n_head = 2;
    config.model.seq_len = 96;
    config.run.kernels = common::Kernels::kFused;
    auto fused = inner::make_model(config);
    config.run.kernels = common::Kernels::kAten;
    auto aten = inner::make_model(config);  // the same seed: the same initial weights
    torch::manual_seed(11);
    const auto x = torch::randint(0, 256, {4, 96}), y = torch::randint(0, 256, {4, 96});
    auto lf = fused->loss(x, y), la = aten->loss(x, y);
    CHECK(std::abs(lf.item<double>() - la.item<double>()) < 1e-5);
    lf.backward();
    la.backward();
    const auto pf = fused->parameters(), pa = aten->parameters();
    REQUIRE(pf.size() == pa.size());
    for (size_t i = 0; i < pf.size(); ++i) {
      CAPTURE(i);
      CHECK(max_rel(pf[i].grad(), pa[i].grad()) < 1e-4);
    }
  }
}

TEST_SUITE("blas_core") {
  TEST_CASE("OpenBLAS's generic fallback on a newer CPU is replaced by the widest kernels it has") {
    inner::CpuSimd avx512{true, true, true, true, true, true, true};
    inner::CpuSimd avx2{true, true, true, false, false, false, false};
    inner::CpuSimd sse{};
    // Emerald Rapids under OpenBLAS 0.3.21: Prescott detected, SkylakeX run.
    auto v = inner::choose_blas_core(avx512, "Prescott", nullptr);
    CHECK(v.core == "SkylakeX");
    CHECK(v.reason.find("Prescott") != std::string::npos);
    CHECK(inner::choose_blas_core(avx2, "Prescott", nullptr).core == "Haswell");
    CHECK(inner::choose_blas_core(avx2, "Sandybridge", nullptr).core == "Haswell");
    CHECK(inner::choose_blas_core(avx512, "Zen", nullptr).core == "SkylakeX");
    // Kept: the right kernels already, a user's own choice, not OpenBLAS, a name we don't know,
    // a CPU with nothing better.
    CHECK(inner::choose_blas_core(avx512, "SkylakeX", nullptr).core.empty());
    CHECK(inner::choose_blas_core(avx512, "cooperlake", nullptr).core.empty());
    CHECK(inner::choose_blas_core(avx2, "Zen", nullptr).core.empty());
    CHECK(inner::choose_blas_core(avx2, "Haswell", nullptr).core.empty());
    const auto user = inner::choose_blas_core(avx512, "Prescott", "Haswell");
    CHECK(user.core.empty());
    CHECK(user.reason.find("OPENBLAS_CORETYPE=Haswell") != std::string::npos);
    CHECK(inner::choose_blas_core(avx512, "", nullptr).core.empty());
    CHECK(inner::choose_blas_core(avx512, "NeoverseN1", nullptr).core.empty());
    CHECK(inner::choose_blas_core(sse, "Prescott", nullptr).core.empty());
    CHECK_FALSE(inner::choose_blas_core(sse, "Prescott", nullptr).reason.empty());
  }

  TEST_CASE("xloco train runs OpenBLAS kernels as wide as the CPU's (re-executed when needed)") {
    test::ScratchDir dir("blas_core");
    const std::string cfg = test::env_or("XLOCO_SOURCE_DIR", ".") + "/configs/kjv-tiny.json";
    // OPENBLAS_CORETYPE unset for the child: this binary re-executed itself with it set
    // (tests/core/main.cpp), and a value in the environment is a user's choice that xloco keeps.
    const std::string saved_core = test::env_or("OPENBLAS_CORETYPE", "");
    const std::string saved_reason = test::env_or("XLOCO_BLAS_CORE_REASON", "");
    ::unsetenv("OPENBLAS_CORETYPE");
    ::unsetenv("XLOCO_BLAS_CORE_REASON");
    const auto r = test::run_xloco(
        "train --config " + cfg + " --set run.dir=" + dir.str() +
        " --set run.name=b --set inner.steps=1 --set model.d_model=32 --set model.n_layer=1"
        " --set model.n_head=2 --set model.seq_len=32 --set inner.batch_size=2"
        " --set inner.warmup_steps=0 --set inner.eval_every=0 --set inner.checkpoint_every=0");
    if (!saved_core.empty()) ::setenv("OPENBLAS_CORETYPE", saved_core.c_str(), 1);
    if (!saved_reason.empty()) ::setenv("XLOCO_BLAS_CORE_REASON", saved_reason.c_str(), 1);
    INFO(r.out);
    REQUIRE(r.code == 0);
    const auto at = r.out.find("OpenBLAS core ");
    if (inner::openblas_core_name().empty()) return;  // LibTorch on MKL: nothing to choose
    REQUIRE(at != std::string::npos);
    const auto name_begin = at + std::string("OpenBLAS core ").size();
    const std::string core = r.out.substr(name_begin, r.out.find(':', name_begin) - name_begin);
    const auto level = inner::openblas_core_level(core);
    if (level == inner::SimdLevel::kUnknown) return;  // a core the rule keeps as it is
    CHECK(static_cast<int>(level) >= static_cast<int>(inner::detect_cpu_simd().level()));
  }
}
