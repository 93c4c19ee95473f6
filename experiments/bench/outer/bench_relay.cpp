// Applying one relayed round (outer/round/relay.h apply_relay) to a 101 M-parameter θ, as a provider
// does each round: K topk frames, the K − 1 it downloads and its own (176 of every 4096, 2
// bits, as the harness's relay runs; K = 4, 16, 64), outer.relay_mean "all", "present" and "clipped" (relay_clip 2; mean = 0, 1,
// 2), and a memcpy of θ in the same run as the reference. Bytes processed: θ's fp32 bytes per
// application; counters: one frame's MB and the round's download (K − 1 frames) in MB, against
// about 101 MB for an aggregated int8 update. The frames are encoded once (about a minute).
//
//   build/experiments/bench/outer/bench_relay --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include <torch/torch.h>

#include "common/layout.h"
#include "compress/encoder.h"
#include "compress/torch_adapter.h"
#include "outer/round/relay.h"

namespace {

using namespace xloco;

constexpr int64_t kNumel = 101'000'000;

constexpr int kMaxFrames = 64;  // K = 64

struct Round {
  common::FlatLayout layout;
  outer::RelayBundle bundle;  // kMaxFrames parts; a smaller K takes the first K
  torch::Tensor theta;
};

const Round& round_of() {
  static const Round r = [] {
    Round out;
    out.layout.append("w", {kNumel});
    torch::manual_seed(1);
    out.theta = torch::randn({kNumel});
    compress::CodecConfig cc;
    cc.codec = compress::Codec::kTopk;
    cc.block_size = 4096;
    cc.topk = 176;
    cc.error_feedback = false;
    out.bundle.lr = 2.0f;
    for (int k = 0; k < kMaxFrames; ++k) {
      torch::manual_seed(100 + k);  // each provider's own elements
      compress::Encoder enc(cc);
      std::vector<uint8_t> frame;
      compress::encode(enc, out.layout, torch::randn({kNumel}) * 1e-3, frame);
      out.bundle.parts.push_back({"p" + std::to_string(k), 1.0, net::Frame(std::move(frame)), false});
    }
    return out;
  }();
  return r;
}

void BM_Memcpy(benchmark::State& state) {
  const Round& r = round_of();
  auto dst = r.theta.clone();  // touched: no first-touch page faults in the loop
  for (auto _ : state) {
    std::memcpy(dst.data_ptr<float>(), r.theta.data_ptr<float>(), kNumel * sizeof(float));
    benchmark::DoNotOptimize(dst.data_ptr<float>());
  }
  state.SetBytesProcessed(state.iterations() * kNumel * static_cast<int64_t>(sizeof(float)));
}

void BM_ApplyRelay(benchmark::State& state) {
  const Round& r = round_of();
  const auto mean = static_cast<common::RelayMean>(state.range(0));  // 0 all, 1 present, 2 clipped
  const int k = static_cast<int>(state.range(1));
  outer::RelayBundle bundle;
  bundle.lr = r.bundle.lr;
  bundle.weight_sum = k;
  bundle.parts.assign(r.bundle.parts.begin(), r.bundle.parts.begin() + k);
  compress::Decoder dec;
  outer::RelayBuffers buf;
  auto theta = r.theta.clone();
  (void)outer::apply_relay(dec, bundle, theta, r.layout, mean, 2.0, buf);  // buffers allocated, as on a replica after its first round
  for (auto _ : state) {
    const auto at = outer::apply_relay(dec, bundle, theta, r.layout, mean, 2.0, buf);
    if (at) state.SkipWithError("non-finite step");
  }
  state.SetBytesProcessed(state.iterations() * kNumel * static_cast<int64_t>(sizeof(float)));
  double download = 0;
  for (int i = 1; i < k; ++i) download += static_cast<double>(bundle.parts[i].frame.size());
  state.counters["frame_MB"] = static_cast<double>(bundle.parts[0].frame.size()) / 1e6;
  state.counters["download_MB"] = download / 1e6;
}

}  // namespace

BENCHMARK(BM_Memcpy)->Iterations(5)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ApplyRelay)
    ->ArgNames({"mean", "K"})
    ->ArgsProduct({{0, 1, 2}, {4, 16, 64}})
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_MAIN();
