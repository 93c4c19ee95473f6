// `make rehearse-many` (experiments/rehearse_many.sh): K simulated providers for a real head.
// Each is a provider leader's own link code (outer/provider/link.h over a CURVE ZeroMQ client, with its
// heartbeats) without its inner steps: it says HELLO with the θ₀ hash the head has (so no state
// is sent), and answers every ROUND_START at once with a pre-encoded uplink frame of the run's
// model (outer.codec_up, e.g. topk 176 of 4096 at 2 bits; `--frames` distinct ones, provider i
// sending frame i mod frames), then counts what each UPDATE brings. The head does all its real
// work: it judges, aggregates, steps and sends to K providers. Writes a JSON of what the
// providers received; the head's own figures are in its metrics and summary.
//
//   rehearse_many keys DIR K                     head.key/.pub and providers/provider-i.key/.pub
//   rehearse_many run --config F [--set k=v]... --keys DIR --endpoint tcp://… --providers K
//                     [--frames 4] [--out FILE]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "common/config.h"
#include "compress/encoder.h"
#include "compress/torch_adapter.h"
#include "inner/dist.h"
#include "inner/model.h"
#include "inner/trainer.h"
#include "net/keys.h"
#include "net/zmq/transport.h"
#include "outer/provider/link.h"
#include "outer/round/sync.h"

namespace {

using namespace xloco;
namespace fs = std::filesystem;

struct Received {
  uint64_t rounds = 0;             // UPDATEs received
  double update_bytes = 0;         // their bytes, all frames
  size_t max_parts = 0;            // the most relayed frames one UPDATE carried
  std::string error;               // why it stopped early
};

struct Model {
  common::FlatLayout layout;
  std::string theta_hash;
  std::vector<net::Frame> frames;
};

// The run's model as the head builds it (its θ₀ hash and layout), and `count` uplink frames of
// random pseudo-gradients encoded by outer.codec_up.
Model prepare(const common::Config& cfg, int count) {
  Model m;
  inner::Group solo{inner::DistOptions{}};
  inner::InnerTrainer t(cfg, inner::make_model(cfg), solo, torch::Device(torch::kCPU));
  m.layout = t.layout();
  m.theta_hash = t.param_hash();
  torch::NoGradGuard guard;
  for (int i = 0; i < count; ++i) {
    torch::manual_seed(100 + i);
    compress::Encoder enc(outer::uplink_codec(cfg.outer));
    std::vector<uint8_t> frame;
    compress::encode(enc, m.layout, torch::randn({m.layout.numel}) * 1e-3, frame);
    m.frames.emplace_back(std::move(frame));
  }
  return m;
}

Received provide(const common::Config& cfg, const Model& m, const std::string& keys,
                 const std::string& endpoint, int index, std::atomic<bool>& stop) {
  Received got;
  const std::string name = "provider-" + std::to_string(index);
  net::zeromq::ClientOptions co;
  co.connect = endpoint;
  co.name = name;
  co.key = net::load_keypair(fs::path(keys) / "providers" / (name + ".key"));
  co.server_public_key = net::load_public_key(fs::path(keys) / "head.pub");
  outer::Link link(std::make_unique<net::zeromq::Client>(co), cfg);
  link.post(net::Hello{name, common::config_hash(cfg), 0, m.theta_hash, index}, 0);
  const uint64_t tokens = static_cast<uint64_t>(cfg.outer.inner_steps) *
                          static_cast<uint64_t>(cfg.inner.batch_size) *
                          static_cast<uint64_t>(cfg.model.seq_len);
  const net::Frame& frame = m.frames[static_cast<size_t>(index) % m.frames.size()];
  while (!stop) {
    auto env = link.next(std::chrono::milliseconds(200));
    if (!env) {
      if (auto why = link.fatal()) got.error = *why;
      if (!got.error.empty()) break;
      continue;
    }
    if (std::holds_alternative<net::RoundStart>(env->body)) {
      link.set_progress(env->round, 0, 0);
      net::Contribution c;
      c.tokens = tokens;
      c.compute_s = 1.0;
      c.payload = frame;
      link.post(std::move(c), env->round);
    } else if (const auto* u = std::get_if<net::Update>(&env->body)) {
      ++got.rounds;
      got.update_bytes += static_cast<double>(u->bytes());
      got.max_parts = std::max(got.max_parts, u->parts.size());
    } else if (std::holds_alternative<net::Bye>(env->body)) {
      break;
    } else if (const auto* e = std::get_if<net::ErrorReply>(&env->body)) {
      spdlog::warn("{}: refused: {} ({})", name, e->reason, net::to_string(e->code));
      if (net::is_fatal(e->code)) {
        got.error = e->reason;
        break;
      }
    }
  }
  return got;
}

int keys(const std::string& dir, int k) {
  net::write_keypair(fs::path(dir) / "head", net::generate_keypair());
  for (int i = 0; i < k; ++i) {
    net::write_keypair(fs::path(dir) / "providers" / ("provider-" + std::to_string(i)),
                       net::generate_keypair());
  }
  return 0;
}

int run(const std::string& config, const std::vector<std::string>& sets, const std::string& keys,
        const std::string& endpoint, int k, int frames, const std::string& out) {
  const common::Config cfg = common::load_config(config, sets);
  const auto t0 = std::chrono::steady_clock::now();
  const Model m = prepare(cfg, frames);
  spdlog::info("rehearse_many: {} parameters, {} frames of {:.2f} MB ({}), {:.0f} s to build",
               m.layout.numel, m.frames.size(), static_cast<double>(m.frames[0].size()) / 1e6,
               common::to_string(cfg.outer.codec_up),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::atomic<bool> stop{false};
  std::vector<Received> got(static_cast<size_t>(k));
  std::vector<std::thread> threads;
  for (int i = 0; i < k; ++i) {
    threads.emplace_back([&, i] {
      try {
        got[static_cast<size_t>(i)] = provide(cfg, m, keys, endpoint, i, stop);
      } catch (const std::exception& e) {
        got[static_cast<size_t>(i)].error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  nlohmann::json j;
  j["providers"] = k;
  j["frame_bytes"] = m.frames[0].size();
  j["params"] = m.layout.numel;
  int failed = 0;
  for (int i = 0; i < k; ++i) {
    const Received& r = got[static_cast<size_t>(i)];
    j["received"].push_back({{"rounds", r.rounds}, {"update_bytes", r.update_bytes},
                             {"max_parts", r.max_parts}, {"error", r.error}});
    if (!r.error.empty()) {
      ++failed;
      spdlog::error("provider-{}: {}", i, r.error);
    }
  }
  if (!out.empty()) std::ofstream(out) << j.dump(1) << "\n";
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"K simulated providers for a real head (make rehearse-many)"};
  app.require_subcommand(1);
  std::string dir, config, keys_dir, endpoint, out;
  std::vector<std::string> sets;
  int k = 4, frames = 4;
  auto* kc = app.add_subcommand("keys", "write a head key pair and K provider key pairs");
  kc->add_option("dir", dir)->required();
  kc->add_option("providers", k)->required()->check(CLI::Range(1, 4096));
  auto* rc = app.add_subcommand("run", "run K simulated providers against a head");
  rc->add_option("--config", config)->required();
  rc->add_option("--set", sets);
  rc->add_option("--keys", keys_dir)->required();
  rc->add_option("--endpoint", endpoint)->required();
  rc->add_option("--providers", k)->required()->check(CLI::Range(1, 4096));
  rc->add_option("--frames", frames)->check(CLI::Range(1, 64));
  rc->add_option("--out", out);
  CLI11_PARSE(app, argc, argv);
  try {
    if (*kc) return keys(dir, k);
    return run(config, sets, keys_dir, endpoint, k, frames, out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rehearse_many: %s\n", e.what());
    return 1;
  }
}
