// Applying one relayed round (outer/round/relay.h apply_relay) to a 101 M-parameter θ, as a provider
// does each round: K topk frames, the K − 1 it downloads and its own (176 of every 4096, 2
// bits, as the harness's relay runs; K = 4, 16, 64), outer.relay_mean "all", "present" and "clipped" (relay_clip 2; mean = 0, 1,
// 2), and a memcpy of θ in the same run as the reference. Bytes processed: θ's fp32 bytes per
// application; counters: one frame's MB and the round's download (K − 1 frames) in MB, against
// about 101 MB for an aggregated int8 update, and the scratch apply_relay holds (MB). θ has the
// tensors of the scale rehearsal's GPT (8 layers, d_model 1024, byte vocabulary); `spans` 0
// works through it as one span (its scratch the size of θ, as before spans), 1 in spans of the
// default chunk (2^24 elements). The frames are encoded once (about a minute).
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

// The scale rehearsal's GPT: embeddings, then per layer attention (qkv, out), MLP (in, out) and
// two norms' weights and biases; about 101 M parameters.
common::FlatLayout gpt_layout() {
  common::FlatLayout l;
  l.append("tok", {256, 1024});
  l.append("pos", {128, 1024});
  for (int i = 0; i < 8; ++i) {
    const std::string p = "h" + std::to_string(i) + ".";
    l.append(p + "ln1.w", {1024});
    l.append(p + "ln1.b", {1024});
    l.append(p + "qkv", {3072, 1024});
    l.append(p + "out", {1024, 1024});
    l.append(p + "ln2.w", {1024});
    l.append(p + "ln2.b", {1024});
    l.append(p + "fc", {4096, 1024});
    l.append(p + "proj", {1024, 4096});
  }
  l.append("lnf.w", {1024});
  l.append("lnf.b", {1024});
  return l;
}

constexpr int kMaxFrames = 64;  // K = 64

struct Round {
  common::FlatLayout layout;
  outer::RelayBundle bundle;  // kMaxFrames parts; a smaller K takes the first K
  torch::Tensor theta;
};

const Round& round_of() {
  static const Round r = [] {
    Round out;
    out.layout = gpt_layout();
    torch::manual_seed(1);
    out.theta = torch::randn({out.layout.numel});
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
      compress::encode(enc, out.layout, torch::randn({out.layout.numel}) * 1e-3, frame);
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
    std::memcpy(dst.data_ptr<float>(), r.theta.data_ptr<float>(), r.layout.bytes());
    benchmark::DoNotOptimize(dst.data_ptr<float>());
  }
  state.SetBytesProcessed(state.iterations() * r.layout.bytes());
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
  if (state.range(2) == 0) buf.chunk = r.layout.numel;  // one span
  auto theta = r.theta.clone();
  (void)outer::apply_relay(dec, bundle, theta, r.layout, mean, 2.0, buf);  // buffers allocated, as on a replica after its first round
  for (auto _ : state) {
    const auto at = outer::apply_relay(dec, bundle, theta, r.layout, mean, 2.0, buf);
    if (at) state.SkipWithError("non-finite step");
  }
  state.SetBytesProcessed(state.iterations() * r.layout.bytes());
  double scratch = 0;
  for (const auto* t : {&buf.acc, &buf.present, &buf.extra, &buf.values}) {
    if (t->defined()) scratch += static_cast<double>(t->numel()) * sizeof(float);
  }
  state.counters["scratch_MB"] = scratch / 1e6;
  double download = 0;
  for (int i = 1; i < k; ++i) download += static_cast<double>(bundle.parts[i].frame.size());
  state.counters["frame_MB"] = static_cast<double>(bundle.parts[0].frame.size()) / 1e6;
  state.counters["download_MB"] = download / 1e6;
}

}  // namespace

BENCHMARK(BM_Memcpy)->Iterations(5)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ApplyRelay)
    ->ArgNames({"mean", "K", "spans"})
    ->ArgsProduct({{0, 1, 2}, {4, 16, 64}, {0, 1}})
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_MAIN();
