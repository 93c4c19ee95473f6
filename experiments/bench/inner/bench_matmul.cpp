// The sgemm peak the inner step is measured against (issue 18, model FLOPs utilisation):
// LibTorch's matmul (OpenBLAS underneath) at the shapes of a GPT step, forward and backward:
// tokens M = batch × seq_len against the weights of a block and the tied LM head. Counters:
// FLOP/s = 2·M·K·N per product. Threads: one intra-op thread; OpenBLAS's own count comes from
// OPENBLAS_NUM_THREADS (throughput.py --mfu sets it).
//
//   bench_matmul --benchmark_filter='d:128' --benchmark_format=json
#include <benchmark/benchmark.h>
#include <torch/torch.h>

namespace {

// C[M, N] = A[M, K] · B[K, N]; `transpose_b` multiplies by B stored [N, K] (a Linear weight,
// as F.linear does in the forward pass).
void BM_matmul(benchmark::State& state) {
  const int64_t M = state.range(0), K = state.range(1), N = state.range(2);
  const bool transpose_b = state.range(3) != 0;
  torch::set_num_threads(1);
  torch::manual_seed(0);
  const auto a = torch::randn({M, K});
  const auto b = transpose_b ? torch::randn({N, K}) : torch::randn({K, N});
  auto c = torch::empty({M, N});
  for (auto _ : state) {
    if (transpose_b) {
      torch::mm_out(c, a, b.t());
    } else {
      torch::mm_out(c, a, b);
    }
    benchmark::DoNotOptimize(c.data_ptr<float>());
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * M * K * N * state.iterations(),
                                                benchmark::Counter::kIsRate);
}

// One GPT block's forward products and the LM head, at the tokens of one step of
// throughput.py --mfu: the tiny GPT (d 128) at 32 × 128, the 25 M GPT (d 512) at 8 × 128.
void gpt_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "K", "N", "t"});
  for (const int64_t d : {128, 512}) {
    const int64_t M = d == 128 ? 4096 : 1024, vocab = 256;
    b->Args({M, d, 3 * d, 1});      // c_attn
    b->Args({M, d, d, 1});          // attn.c_proj
    b->Args({M, d, 4 * d, 1});      // mlp.c_fc
    b->Args({M, 4 * d, d, 1});      // mlp.c_proj
    b->Args({M, d, vocab, 1});      // tied LM head
    b->Args({M, 4 * d, d, 0});      // a backward product (grad input), B not transposed
  }
}

}  // namespace

BENCHMARK(BM_matmul)->Apply(gpt_shapes)->Unit(benchmark::kMicrosecond)->MinTime(1.0);
BENCHMARK_MAIN();
