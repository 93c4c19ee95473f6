#include "outer/provider.h"

#include <chrono>
#include <filesystem>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "common/error.h"
#include "common/metrics.h"
#include "common/process.h"
#include "inner/data.h"
#include "inner/model.h"
#include "inner/runtime.h"
#include "inner/trainer.h"
#include "net/protocol.h"
#include "outer/round.h"
#include "outer/sync.h"

namespace xloco::outer {
namespace fs = std::filesystem;

namespace {

// What the leader tells its ranks, over a Gloo broadcast of two int64s: (shard, shards) once,
// then (command, round) per round.
enum Command : int64_t { kStop = 0, kRound = 1 };

class Leader {
 public:
  Leader(const common::Config& cfg, const ProviderOptions& opts, std::unique_ptr<net::Transport> t)
      : cfg_(cfg), opts_(opts), net_(std::move(t)), up_(uplink_codec(cfg.outer)) {}

  // Sends HELLO and waits for WELCOME; returns (shard, shards) and keeps the state frame.
  std::pair<int, int> join() {
    send(net::Hello{opts_.name, common::config_hash(cfg_), 0}, 0);
    spdlog::info("provider {}: HELLO sent to {}", opts_.name, net_->endpoint());
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(cfg_.outer.round_timeout_s));
    while (Clock::now() < deadline) {
      XLOCO_ENFORCE(common::pending_signal() == 0, common::Error, "interrupted while joining");
      auto env = next(std::chrono::milliseconds(200));
      if (!env) continue;
      if (auto* w = std::get_if<net::Welcome>(&env->body)) {
        welcome_ = *w;
        done_round_ = env->round;
        return {static_cast<int>(w->shard_index), static_cast<int>(w->shard_count)};
      }
      if (auto* e = std::get_if<net::ErrorReply>(&env->body)) {
        throw common::Error(fmt::format("the head refused provider {}: {} ({})", opts_.name,
                                        e->reason, e->code));
      }
    }
    throw common::Error(fmt::format("no WELCOME from the head at {} within {:.0f} s",
                                    net_->endpoint(), cfg_.outer.round_timeout_s));
  }

  void load_welcome(torch::Tensor& theta_pub, const Slots& slots) {
    dec_.decode(welcome_.state.data(), welcome_.state.size(), views(theta_pub, slots));
    welcome_ = {};
  }

  // Waits for the head's next instruction, applying updates on the way. Returns the round to
  // run, or 0 to stop.
  uint64_t next_round(torch::Tensor& theta_pub, const Slots& slots) {
    while (true) {
      if (common::pending_signal() != 0) {
        send(net::Bye{"provider interrupted"}, done_round_);
        stopped_by_signal_ = true;
        return 0;
      }
      auto env = next(std::chrono::milliseconds(200));
      if (!env) continue;
      if (std::holds_alternative<net::RoundStart>(env->body)) return env->round;
      if (auto* u = std::get_if<net::Update>(&env->body)) {
        apply_update(dec_, u->payload.data(), u->payload.size(), cfg_.outer, theta_pub, slots);
        done_round_ = env->round;
      } else if (auto* b = std::get_if<net::Bye>(&env->body)) {
        spdlog::info("provider {}: the head says goodbye ({})", opts_.name, b->reason);
        return 0;
      } else if (auto* e = std::get_if<net::ErrorReply>(&env->body)) {
        spdlog::warn("provider {}: the head reports {} ({})", opts_.name, e->reason, e->code);
      } else if (auto* w = std::get_if<net::Welcome>(&env->body)) {
        dec_.decode(w->state.data(), w->state.size(), views(theta_pub, slots));
        done_round_ = env->round;
      }
    }
  }

  // δ = θ_pub − θ is computed in θ's own memory (on a GPU, in its host copy): θ is spent once
  // the round's steps are done, and the next round starts by overwriting it with θ_pub.
  void contribute(uint64_t r, const torch::Tensor& theta_pub, torch::Tensor& theta,
                  const Slots& slots, uint64_t tokens, double compute_s) {
    torch::NoGradGuard guard;
    torch::Tensor delta = theta.is_cpu() ? theta : theta.to(torch::kCPU);
    torch::sub_out(delta, theta_pub, delta);
    std::vector<uint8_t> frame;
    up_.encode(const_views(delta, slots), frame);
    bytes_up_ += static_cast<double>(frame.size());
    net::Contribution c;
    c.tokens = tokens;
    c.compute_s = compute_s;
    c.payload = net::Frame(std::move(frame));
    send(c, r);
  }

  void goodbye(const std::string& reason) { send(net::Bye{reason}, done_round_); }
  bool stopped_by_signal() const { return stopped_by_signal_; }
  double bytes_up() const { return bytes_up_; }

 private:
  void send(net::Body body, uint64_t r) {
    net::Envelope env{cfg_.run.name, r, std::move(body)};
    const auto st = net_->send(net::kHeadPeer, net::encode(env));
    if (st != net::SendStatus::kSent) {
      spdlog::warn("provider {}: {} to the head: {}", opts_.name, net::to_string(env.type()),
                   net::to_string(st));
    }
  }

  std::optional<net::Envelope> next(std::chrono::milliseconds timeout) {
    auto rx = net_->receive(timeout);
    if (!rx) return std::nullopt;
    try {
      return net::decode(rx->message, cfg_.run.name);
    } catch (const net::ProtocolError& e) {
      spdlog::warn("provider {}: ignored a bad message from the head: {}", opts_.name, e.what());
      return std::nullopt;
    }
  }

  const common::Config& cfg_;
  const ProviderOptions& opts_;
  std::unique_ptr<net::Transport> net_;
  compress::Encoder up_;
  compress::Decoder dec_;
  net::Welcome welcome_;
  uint64_t done_round_ = 0;
  bool stopped_by_signal_ = false;
  double bytes_up_ = 0;
};

}  // namespace

int run_provider(const common::Config& cfg, const ProviderOptions& opts, inner::Group& group,
                 std::unique_ptr<net::Transport> transport) {
  common::install_forwarding_handlers();
  const bool leader = group.leader();
  std::unique_ptr<Leader> lead;
  auto ctrl = torch::zeros({2}, torch::kInt64);
  if (leader) {
    lead = std::make_unique<Leader>(cfg, opts, std::move(transport));
    const auto [shard, shards] = lead->join();
    ctrl[0] = shard;
    ctrl[1] = shards;
  }
  group.broadcast(ctrl);
  const inner::Shard shard{static_cast<int>(ctrl[0].item<int64_t>()),
                           static_cast<int>(ctrl[1].item<int64_t>())};
  auto data = inner::make_dataset(cfg, shard);
  const auto device = inner::resolve_device(cfg.run.device);
  inner::InnerTrainer trainer(cfg, inner::make_model(cfg), group, device);
  const Slots& slots = trainer.slots();
  torch::Tensor theta_pub = torch::empty({trainer.params().numel()}, torch::kFloat32);
  if (leader) {
    lead->load_welcome(theta_pub, slots);
    spdlog::info("provider {}: joined as shard {}/{} | {}", opts.name, shard.index, shard.count,
                 data->describe());
  }
  common::JsonlWriter metrics;
  if (leader) metrics.open((fs::path(opts.run_dir) / "metrics" / ("provider-" + opts.name + ".jsonl")).string());

  const int H = cfg.outer.inner_steps;
  const auto t0 = Clock::now();
  while (true) {
    ctrl.zero_();
    if (leader) {
      const uint64_t r = lead->next_round(theta_pub, slots);
      ctrl[0] = r == 0 ? kStop : kRound;
      ctrl[1] = static_cast<int64_t>(r);
    }
    group.broadcast(ctrl);
    if (ctrl[0].item<int64_t>() == kStop) break;
    const auto r = static_cast<uint64_t>(ctrl[1].item<int64_t>());
    {
      torch::NoGradGuard guard;
      if (leader) trainer.params().copy_(theta_pub);
      group.broadcast(trainer.params());
    }
    const auto compute_start = Clock::now();
    uint64_t tokens = 0;
    bool stop = false;
    const int64_t first = static_cast<int64_t>(r - 1) * H;
    const int64_t end = std::min<int64_t>(first + H, cfg.inner.steps);
    for (int64_t step = first; step < end; ++step) {
      const auto st = trainer.train_step(*data, step, common::pending_signal() != 0);
      tokens += static_cast<uint64_t>(st.tokens);
      if ((step + 1) % cfg.inner.log_every == 0 || step + 1 == end) {
        const double secs = std::chrono::duration<double>(Clock::now() - compute_start).count();
        const double rate = static_cast<double>(tokens) / std::max(secs, 1e-9);
        spdlog::info("{} | round {} | step {}/{} | loss {:.4f} | lr {:.2e} | {} tok/s", opts.name,
                     r, step + 1, cfg.inner.steps, st.loss, st.lr, common::human_rate(rate));
        metrics.write({{"round", r}, {"step", step + 1}, {"loss", st.loss}, {"lr", st.lr},
                       {"tokens_per_s", rate}});
      }
      if (st.stop) {
        stop = true;
        break;
      }
    }
    if (stop) {
      if (leader) {
        spdlog::warn("provider {}: interrupted in round {}", opts.name, r);
        lead->goodbye("provider interrupted");
      }
      return 130;
    }
    const double compute_s = std::chrono::duration<double>(Clock::now() - compute_start).count();
    if (leader) lead->contribute(r, theta_pub, trainer.params(), slots, tokens, compute_s);
  }
  if (leader) {
    const auto hash = common::hash_hex(theta_pub.data_ptr(), static_cast<size_t>(theta_pub.numel()) * 4);
    spdlog::info("provider {}: finished after {} | {} sent | theta_pub {} | peak RSS {}", opts.name,
                 common::human_duration(std::chrono::duration<double>(Clock::now() - t0).count()),
                 common::human_bytes(lead->bytes_up()), hash,
                 common::human_bytes(static_cast<double>(common::peak_rss_bytes())));
    metrics.write({{"final", true}, {"theta_pub_hash", hash}, {"bytes_up", lead->bytes_up()},
                   {"peak_rss_bytes", common::peak_rss_bytes()},
                   {"param_bytes", theta_pub.numel() * 4}});
  }
  return leader && lead->stopped_by_signal() ? 130 : 0;
}

}  // namespace xloco::outer
