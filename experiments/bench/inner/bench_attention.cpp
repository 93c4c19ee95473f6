// The fused causal attention (src/inner/kernels.h) against LibTorch's ops (the same function
// with run.kernels = aten), forward + backward, in the same run (issue 18: each kernel measured
// on its own). Shapes: the tiny GPT's step (batch 32, T 128, d 128, 4 heads), the 25 M GPT's
// (batch 8, T 128, d 512, 8 heads) and GPT-2 small's context (batch 2, T 1024, d 768, 12 heads).
// Threads: 1 intra-op; OpenBLAS's from OPENBLAS_NUM_THREADS.
//
//   bench_attention --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "inner/kernels.h"

namespace {

void BM_attention(benchmark::State& state) {
  const int64_t B = state.range(0), T = state.range(1), C = state.range(2), H = state.range(3);
  const bool fused = state.range(4) != 0;
  torch::set_num_threads(1);
  torch::manual_seed(0);
  const auto qkv0 = torch::randn({B, T, 3 * C});
  const auto w = torch::randn({B, T, C});
  for (auto _ : state) {
    auto qkv = qkv0.detach().requires_grad_(true);
    auto y = fused ? xloco::inner::causal_attention(qkv, H)
                   : xloco::inner::causal_attention_aten(qkv, H);
    (y * w).sum().backward();
    benchmark::DoNotOptimize(qkv.grad().data_ptr<float>());
  }
  state.SetLabel(fused ? "fused" : "aten");
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(B * T * state.iterations()), benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK(BM_attention)
    ->ArgNames({"B", "T", "C", "H", "fused"})
    ->Args({32, 128, 128, 4, 0})->Args({32, 128, 128, 4, 1})
    ->Args({8, 128, 512, 8, 0})->Args({8, 128, 512, 8, 1})
    ->Args({2, 1024, 768, 12, 0})->Args({2, 1024, 768, 12, 1})
    ->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK_MAIN();
