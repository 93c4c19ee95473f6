#include "outer/provider.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>
#include <utility>

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

// What the leader tells its ranks, over a Gloo broadcast of three int64s: (shard, shards, 0)
// once, then (command, round, fresh AdamW state) per round.
enum Command : int64_t { kStop = 0, kRound = 1 };

// The leader's link to the head, on its own thread: it sends what the leader posts, sends a
// HEARTBEAT every outer.heartbeat_s (so a provider deep in its inner steps is not taken for
// dead), and queues what arrives. The transport is used from this thread only.
class Link {
 public:
  Link(std::unique_ptr<net::Transport> t, const common::Config& cfg)
      : net_(std::move(t)), run_(cfg.run.name), heartbeat_s_(cfg.outer.heartbeat_s),
        thread_([this] { loop(); }) {}
  ~Link() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    thread_.join();
  }

  void post(net::Body body, uint64_t round) {
    std::lock_guard<std::mutex> lock(mu_);
    outbox_.push_back(net::encode(net::Envelope{run_, round, std::move(body)}));
  }

  std::optional<net::Envelope> next(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [this] { return !inbox_.empty(); })) return std::nullopt;
    auto m = std::move(inbox_.front());
    inbox_.pop_front();
    return m;
  }

  void set_progress(uint64_t round, uint64_t step, double tokens_per_s) {
    std::lock_guard<std::mutex> lock(mu_);
    round_ = round;
    step_ = step;
    tokens_per_s_ = tokens_per_s;
  }
  double head_silent_s() const {
    std::lock_guard<std::mutex> lock(mu_);
    return std::chrono::duration<double>(Clock::now() - last_rx_).count();
  }
  std::string endpoint() const { return net_->endpoint(); }

 private:
  void loop() {
    auto last_beat = Clock::now();
    while (true) {
      std::deque<net::Message> out;
      bool stop = false;
      net::Heartbeat beat;
      uint64_t round = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        out.swap(outbox_);
        stop = stop_;
        beat = {step_, tokens_per_s_};
        round = round_;
      }
      for (const auto& m : out) send(m);
      if (stop) return;  // after the last posts (a BYE) went out
      if (std::chrono::duration<double>(Clock::now() - last_beat).count() >= heartbeat_s_) {
        last_beat = Clock::now();
        send(net::encode(net::Envelope{run_, round, beat}));
      }
      auto rx = net_->receive(std::chrono::milliseconds(20));
      if (!rx) continue;
      try {
        auto env = net::decode(rx->message, run_);
        std::lock_guard<std::mutex> lock(mu_);
        last_rx_ = Clock::now();
        inbox_.push_back(std::move(env));
        cv_.notify_one();
      } catch (const net::ProtocolError& e) {
        spdlog::warn("ignored a bad message from the head: {}", e.what());
      }
    }
  }
  void send(const net::Message& m) {
    const auto st = net_->send(net::kHeadPeer, m);
    if (st != net::SendStatus::kSent) {
      spdlog::warn("message to the head at {}: {}", net_->endpoint(), net::to_string(st));
    }
  }

  std::unique_ptr<net::Transport> net_;
  const std::string run_;
  const double heartbeat_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<net::Message> outbox_;
  std::deque<net::Envelope> inbox_;
  bool stop_ = false;
  uint64_t round_ = 0, step_ = 0;
  double tokens_per_s_ = 0;
  Clock::time_point last_rx_ = Clock::now();
  std::thread thread_;  // last: starts once everything above exists
};

class Leader {
 public:
  Leader(const common::Config& cfg, const ProviderOptions& opts, std::unique_ptr<net::Transport> t)
      : cfg_(cfg), opts_(opts), link_(std::move(t), cfg), up_(uplink_codec(cfg.outer)) {}

  // Sends HELLO and waits for WELCOME; returns (shard, shards) and keeps the state frame.
  std::pair<int, int> join() {
    hello("");
    spdlog::info("provider {}: HELLO sent to {}", opts_.name, link_.endpoint());
    while (true) {
      XLOCO_ENFORCE(common::pending_signal() == 0, common::Error, "interrupted while joining");
      check_head_alive();
      auto env = link_.next(std::chrono::milliseconds(200));
      if (!env) continue;
      if (auto* w = std::get_if<net::Welcome>(&env->body)) {
        XLOCO_ENFORCE(!w->state.empty(), common::Error,
                      "the head's WELCOME to a fresh provider carries no state");
        welcome_ = *w;
        done_round_ = env->round;
        return {static_cast<int>(w->shard_index), static_cast<int>(w->shard_count)};
      }
      if (auto* e = std::get_if<net::ErrorReply>(&env->body)) {
        throw common::Error(fmt::format("the head refused provider {}: {} ({})", opts_.name,
                                        e->reason, e->code));
      }
    }
  }

  void load_welcome(torch::Tensor& theta_pub, const Slots& slots) {
    dec_.decode(welcome_.state.data(), welcome_.state.size(), views(theta_pub, slots));
    shard_ = {static_cast<int>(welcome_.shard_index), static_cast<int>(welcome_.shard_count)};
    welcome_ = {};
  }

  // Waits for the head's next instruction, applying updates and resynchronising on the way.
  // Returns the round to run, or 0 to stop.
  uint64_t next_round(torch::Tensor& theta_pub, const Slots& slots) {
    while (true) {
      if (common::pending_signal() != 0) {
        link_.post(net::Bye{"provider interrupted"}, done_round_);
        stopped_by_signal_ = true;
        return 0;
      }
      check_head_alive();
      auto env = link_.next(std::chrono::milliseconds(200));
      if (!env) continue;
      const uint64_t r = env->round;
      if (std::holds_alternative<net::RoundStart>(env->body)) {
        if (r == done_round_ + 1 && !rejoining_) return r;
        if (!rejoining_) {
          resync(theta_pub, fmt::format("round {} starts, but this provider holds round {}", r,
                                        done_round_));
        }
      } else if (auto* u = std::get_if<net::Update>(&env->body)) {
        if (r == done_round_ + 1) {
          apply_update(dec_, u->payload.data(), u->payload.size(), cfg_.outer, theta_pub, slots);
          done_round_ = r;
        } else if (r > done_round_ + 1 && !rejoining_) {
          resync(theta_pub, fmt::format("update for round {}, but this provider holds round {}",
                                        r, done_round_));
        }
      } else if (auto* w = std::get_if<net::Welcome>(&env->body)) {
        XLOCO_ENFORCE(static_cast<int>(w->shard_index) == shard_.index &&
                          static_cast<int>(w->shard_count) == shard_.count,
                      common::Error,
                      "the head moved provider {} from shard {}/{} to {}/{}; restart it", opts_.name,
                      shard_.index, shard_.count, w->shard_index, w->shard_count);
        if (!w->state.empty()) {
          dec_.decode(w->state.data(), w->state.size(), views(theta_pub, slots));
          fresh_state_ = true;  // design §2: full state starts a fresh AdamW state
        }
        done_round_ = r;
        rejoining_ = false;
        spdlog::info("provider {}: back in the run at round {} ({})", opts_.name, r,
                     w->state.empty() ? "its state was current" : "full state received");
      } else if (auto* b = std::get_if<net::Bye>(&env->body)) {
        spdlog::info("provider {}: the head says goodbye ({})", opts_.name, b->reason);
        return 0;
      } else if (auto* e = std::get_if<net::ErrorReply>(&env->body)) {
        if (e->code == "rejoin") {
          if (!rejoining_) resync(theta_pub, e->reason);
        } else {
          spdlog::warn("provider {}: the head reports {} ({})", opts_.name, e->reason, e->code);
          XLOCO_ENFORCE(e->code != "config_hash" && e->code != "full", common::Error,
                        "the head refused provider {}: {} ({})", opts_.name, e->reason, e->code);
        }
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
    tokens_ += tokens;  // reported in the next HELLO
    net::Contribution c;
    c.tokens = tokens;
    c.compute_s = compute_s;
    c.payload = net::Frame(std::move(frame));
    link_.post(c, r);
  }

  void progress(uint64_t round, uint64_t step, double tokens_per_s) {
    link_.set_progress(round, step, tokens_per_s);
  }
  bool take_fresh_state() { return std::exchange(fresh_state_, false); }
  void goodbye(const std::string& reason) { link_.post(net::Bye{reason}, done_round_); }
  bool stopped_by_signal() const { return stopped_by_signal_; }
  double bytes_up() const { return bytes_up_; }

 private:
  void hello(const std::string& hash) {
    link_.post(net::Hello{opts_.name, common::config_hash(cfg_), tokens_, hash}, done_round_);
    last_hello_ = Clock::now();
    last_hash_ = hash;
  }

  // The head restarted, declared this provider dead, or it missed updates: HELLO again with
  // the hash of the θ_pub it holds; the head answers with what it lacks (design §2). The
  // provider's ranks keep running; they wait in the next control broadcast.
  void resync(const torch::Tensor& theta_pub, const std::string& why) {
    spdlog::warn("provider {}: rejoining the head ({})", opts_.name, why);
    rejoining_ = true;
    hello(common::hash_hex(theta_pub.data_ptr(), static_cast<size_t>(theta_pub.numel()) * 4));
  }

  void check_head_alive() {
    const double silent = link_.head_silent_s();
    XLOCO_ENFORCE(silent < cfg_.outer.head_timeout_s, common::Error,
                  "provider {}: the head at {} has been silent for {:.0f}s "
                  "(outer.head_timeout_s); giving up",
                  opts_.name, link_.endpoint(), silent);
    if (silent > 3 * cfg_.outer.heartbeat_s + 1 && !head_quiet_) {
      head_quiet_ = true;
      spdlog::warn("provider {}: no word from the head for {:.0f}s; waiting (the link reconnects "
                   "by itself)", opts_.name, silent);
    } else if (silent < cfg_.outer.heartbeat_s) {
      head_quiet_ = false;
    }
    // A HELLO may have gone to a head that died before answering: ask again now and then.
    if (rejoining_ && std::chrono::duration<double>(Clock::now() - last_hello_).count() >
                          std::max(10.0, cfg_.outer.dead_after_s)) {
      hello(last_hash_);
    }
  }

  const common::Config& cfg_;
  const ProviderOptions& opts_;
  Link link_;
  compress::Encoder up_;
  compress::Decoder dec_;
  net::Welcome welcome_;
  inner::Shard shard_{0, 1};
  uint64_t done_round_ = 0;
  uint64_t tokens_ = 0;
  bool rejoining_ = false, fresh_state_ = false, head_quiet_ = false;
  std::string last_hash_;
  Clock::time_point last_hello_{};
  bool stopped_by_signal_ = false;
  double bytes_up_ = 0;
};

}  // namespace

int run_provider(const common::Config& cfg, const ProviderOptions& opts, inner::Group& group,
                 std::unique_ptr<net::Transport> transport) {
  common::install_forwarding_handlers();
  const bool leader = group.leader();
  std::unique_ptr<Leader> lead;
  auto ctrl = torch::zeros({3}, torch::kInt64);
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
      ctrl[2] = lead->take_fresh_state() ? 1 : 0;
    }
    group.broadcast(ctrl);
    if (ctrl[0].item<int64_t>() == kStop) break;
    const auto r = static_cast<uint64_t>(ctrl[1].item<int64_t>());
    if (ctrl[2].item<int64_t>() != 0) {
      trainer.reset_optimizer();  // resynchronised with full state: a fresh AdamW state
      if (leader) spdlog::info("provider {}: fresh AdamW state after a full-state resync", opts.name);
    }
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
        if (leader) lead->progress(r, static_cast<uint64_t>(step + 1), rate);
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
