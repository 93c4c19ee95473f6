// Codec throughput against memcpy of the same buffer in the same run (design §9): encode,
// decode and encode+decode GB/s of fp32 input per codec and zstd level, and wire bytes per
// fp32 byte (topk: 64 of every 4096 values). Data: 10M heavy-tailed floats shaped like a pseudo-gradient (Student-t, 3 degrees
// of freedom, a scale that changes every 64K elements as it does between layers).
//
//   bench_codec --benchmark_counters_tabular=true
//
// Counters: wire = frame bytes / fp32 bytes; x_memcpy = this GB/s / memcpy GB/s of the same
// buffer, from the fastest BM_Memcpy run before it (Google Benchmark prints the ratio with a
// "/s" suffix because it is computed as a rate); zstd_kept = 1 when zstd paid and was kept.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <ctime>
#include <cstring>
#include <random>
#include <vector>

#include "compress/decoder.h"
#include "compress/encoder.h"

namespace xloco::compress {
namespace {

constexpr size_t kElements = 10'000'000;
constexpr double kFp32Bytes = 4.0 * kElements;

const std::vector<float>& pseudo_gradient() {
  static const std::vector<float> data = [] {
    std::mt19937_64 rng(2024);
    std::student_t_distribution<float> t(3.0f);
    std::lognormal_distribution<float> layer_scale(std::log(1e-3f), 1.0f);
    std::vector<float> v(kElements);
    float s = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      if (i % 65536 == 0) s = layer_scale(rng);
      v[i] = s * t(rng);
    }
    return v;
  }();
  return data;
}

// Rates use this thread's CPU time (Google Benchmark's default), which a shared 2-core machine
// disturbs far less than wall time; the tables print wall time beside it.
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// memcpy of the whole buffer, bytes per CPU second: the fastest BM_Memcpy run of this process
// (it runs first), or a best-of-20 measurement when BM_Memcpy is filtered out.
double g_memcpy_rate = 0;

double memcpy_bytes_per_second() {
  if (g_memcpy_rate == 0) {
    const auto& src = pseudo_gradient();
    std::vector<float> dst(src.size());
    for (int i = 0; i < 20; ++i) {
      const double t0 = thread_cpu_seconds();
      std::memcpy(dst.data(), src.data(), 4 * src.size());
      benchmark::ClobberMemory();
      g_memcpy_rate = std::max(g_memcpy_rate, kFp32Bytes / (thread_cpu_seconds() - t0));
    }
  }
  return g_memcpy_rate;
}

std::vector<ConstTensorRef> inputs() {
  return {{"pseudo_gradient", {static_cast<int64_t>(kElements)}, pseudo_gradient().data()}};
}

CodecConfig config_of(const benchmark::State& state, uint32_t topk_bits) {
  CodecConfig c;
  c.codec = static_cast<Codec>(state.range(0));
  c.zstd_level = static_cast<int>(state.range(1));
  if (c.codec == Codec::kTopk) {  // the harness's topk setting: 64 of every 4096 values
    c.block_size = 4096;
    c.topk = 64;
    c.topk_bits = topk_bits;
  }
  return c;
}

void report(benchmark::State& state, size_t frame_bytes, bool zstd) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kFp32Bytes));
  state.counters["wire"] = frame_bytes / kFp32Bytes;
  state.counters["zstd_kept"] = zstd ? 1 : 0;
  state.counters["x_memcpy"] = benchmark::Counter(
      state.iterations() * kFp32Bytes / memcpy_bytes_per_second(), benchmark::Counter::kIsRate);
  state.SetLabel(std::string(to_string(static_cast<Codec>(state.range(0)))) + " zstd " +
                 std::to_string(state.range(1)));
}

void BM_Memcpy(benchmark::State& state) {
  const auto& src = pseudo_gradient();
  std::vector<float> dst(src.size());
  const double t0 = thread_cpu_seconds();
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), 4 * src.size());
    benchmark::ClobberMemory();
  }
  const double dt = thread_cpu_seconds() - t0;
  if (state.iterations() >= 10) {
    g_memcpy_rate = std::max(g_memcpy_rate, state.iterations() * kFp32Bytes / dt);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kFp32Bytes));
}

// Error feedback on, as a provider runs it: each encode also updates the residual.
// `bits`: topk's value width (the BM_*Bits/4 rows; the plain rows are 2).
void BM_EncodeBits(benchmark::State& state, uint32_t bits) {
  Encoder enc(config_of(state, bits));
  std::vector<uint8_t> frame;
  const auto in = inputs();
  enc.encode(in, frame);
  for (auto _ : state) {
    enc.encode(in, frame);
    benchmark::DoNotOptimize(frame.data());
  }
  report(state, frame.size(), enc.last_stats().zstd);
}

void BM_DecodeBits(benchmark::State& state, uint32_t bits) {
  Encoder enc(config_of(state, bits));
  const auto frame = enc.encode(inputs());
  std::vector<float> out(kElements);
  const std::vector<TensorRef> targets = {
      {"pseudo_gradient", {static_cast<int64_t>(kElements)}, out.data()}};
  Decoder dec;
  dec.decode(frame, targets);
  for (auto _ : state) {
    dec.decode(frame, targets);
    benchmark::ClobberMemory();
  }
  report(state, frame.size(), enc.last_stats().zstd);
}

void BM_EncodeDecodeBits(benchmark::State& state, uint32_t bits) {
  Encoder enc(config_of(state, bits));
  std::vector<uint8_t> frame;
  std::vector<float> out(kElements);
  const std::vector<TensorRef> targets = {
      {"pseudo_gradient", {static_cast<int64_t>(kElements)}, out.data()}};
  const auto in = inputs();
  Decoder dec;
  enc.encode(in, frame);
  dec.decode(frame, targets);
  for (auto _ : state) {
    enc.encode(in, frame);
    dec.decode(frame, targets);
    benchmark::ClobberMemory();
  }
  report(state, frame.size(), enc.last_stats().zstd);
}

void codecs_and_levels(benchmark::internal::Benchmark* b) {
  for (const Codec codec : {Codec::kFp32, Codec::kBf16, Codec::kInt8, Codec::kInt4, Codec::kTopk}) {
    for (const int level : {0, 1, 3}) b->Args({static_cast<int64_t>(codec), level});
  }
  b->ArgNames({"codec", "zstd"})->Unit(benchmark::kMillisecond);
}

void BM_Encode(benchmark::State& state) { BM_EncodeBits(state, 2); }
void BM_Decode(benchmark::State& state) { BM_DecodeBits(state, 2); }
void BM_EncodeDecode(benchmark::State& state) { BM_EncodeDecodeBits(state, 2); }

void topk_levels(benchmark::internal::Benchmark* b) {
  for (const int level : {0, 1, 3}) b->Args({static_cast<int64_t>(Codec::kTopk), level});
  b->ArgNames({"codec", "zstd"})->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Encode)->Apply(codecs_and_levels);
BENCHMARK(BM_Decode)->Apply(codecs_and_levels);
BENCHMARK(BM_EncodeDecode)->Apply(codecs_and_levels);
// topk with 4-bit values (outer.topk_bits = 4): BM_EncodeBits/4/codec:4/zstd:1 and so on.
BENCHMARK_CAPTURE(BM_EncodeBits, 4, 4u)->Apply(topk_levels);
BENCHMARK_CAPTURE(BM_DecodeBits, 4, 4u)->Apply(topk_levels);
BENCHMARK_CAPTURE(BM_EncodeDecodeBits, 4, 4u)->Apply(topk_levels);

}  // namespace
}  // namespace xloco::compress

BENCHMARK_MAIN();
