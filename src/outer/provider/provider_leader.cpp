#include "outer/provider/provider_leader.h"

#include <cstdlib>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "common/error.h"
#include "common/process.h"
#include "common/text.h"
#include "compress/torch_adapter.h"

namespace xloco::outer {

std::string flat_hash(const torch::Tensor& t) {
  return common::hash_hex(t.data_ptr(), static_cast<size_t>(t.numel()) * 4);
}

Leader::Leader(const common::Config& cfg, const ProviderOptions& opts, std::unique_ptr<net::Transport> t)
    : cfg_(cfg), opts_(opts), link_(std::move(t), cfg), up_(uplink_codec(cfg.outer)),
      // Parsed before joining: a malformed value is an error before the head admits it.
      attack_(attack_for(std::getenv("XLOCO_ATTACK"), opts.name)) {
  if (attack_) {
    spdlog::warn("provider {}: XLOCO_ATTACK makes it send {} instead of its pseudo-gradient "
                 "(a test device for the attack table)", opts_.name, attack_->text);
  }
}

inner::Shard Leader::join(torch::Tensor& theta_pub, const common::FlatLayout& layout) {
  fragments_ = split_fragments(layout, cfg_.outer.fragments);
  state_.rejoining = true;  // waiting for a WELCOME: check_head_alive repeats the HELLO
  hello(flat_hash(theta_pub));
  spdlog::info("provider {}: HELLO sent to {}", opts_.name, link_.endpoint());
  bool updated = false;
  while (true) {
    XLOCO_ENFORCE(common::pending_signal() == 0, common::Error, "interrupted while joining");
    if (auto why = link_.fatal()) throw common::ConfigError(*why);
    check_head_alive();
    auto env = link_.next(std::chrono::milliseconds(200));
    if (!env) continue;
    if (auto* u = std::get_if<net::Update>(&env->body)) {
      if (const auto problem = take_update(*u, env->round, theta_pub)) {
        // The WELCOME that follows is judged by the hash the HELLO sent: it brings the state.
        spdlog::warn("provider {}: {}; waiting for the WELCOME", opts_.name, *problem);
        continue;
      }
      updated = true;
      continue;
    }
    if (auto* w = std::get_if<net::Welcome>(&env->body)) {
      if (!w->state.empty()) {
        take_state(w->state, theta_pub, layout);
      } else {
        spdlog::info("provider {}: the model it built from {}{} is the head's: no state to "
                     "download", opts_.name, opts_.init.empty() ? "the run's seed" : opts_.init,
                     updated ? ", with the last round's update," : "");
      }
      state_ = {env->round, false, w->shard_index, w->shard_count};
      return {static_cast<int>(w->shard_index), static_cast<int>(w->shard_count)};
    }
    if (auto* e = std::get_if<net::ErrorReply>(&env->body)) {
      // "Not a member: send HELLO" answers a message that reached the head before this
      // HELLO did (a heartbeat can pass a HELLO still queued): the HELLO is on its way, and
      // check_head_alive repeats it if no WELCOME comes. Any other refusal ends the join.
      if (on_head_message(state_, *env).action == LeaderAction::kRepeatHello) {
        spdlog::info("provider {}: the head had not seen its HELLO yet ({}); waiting for the "
                     "WELCOME", opts_.name, e->reason);
        continue;
      }
      throw common::Error(fmt::format("the head refused provider {}: {} ({})", opts_.name,
                                      e->reason, net::to_string(e->code)));
    }
  }
}

uint64_t Leader::next_round(torch::Tensor& theta_pub, const common::FlatLayout& layout) {
  while (true) {
    if (auto r = poll(theta_pub, layout, std::chrono::milliseconds(200))) return *r;
  }
}

std::optional<uint64_t> Leader::poll(torch::Tensor& theta_pub, const common::FlatLayout& layout,
                             std::chrono::milliseconds wait) {
  while (true) {
    if (common::pending_signal() != 0) {
      link_.post(net::Bye{"provider interrupted"}, state_.done_round);
      stopped_by_signal_ = true;
      return 0;
    }
    check_head_alive();
    auto env = link_.next(wait);
    if (!env) return std::nullopt;
    const LeaderVerdict v = on_head_message(state_, *env);
    switch (v.action) {
      case LeaderAction::kRunRound: return env->round;
      case LeaderAction::kApplyUpdate:
        if (const auto problem = take_update(std::get<net::Update>(env->body), env->round, theta_pub)) {
          resync(theta_pub, *problem);  // the head sends what it lacks
          break;
        }
        state_.done_round = env->round;
        break;
      case LeaderAction::kResync: resync(theta_pub, v.reason); break;
      case LeaderAction::kRejoined: rejoined(*env, theta_pub, layout, v.reason); break;
      case LeaderAction::kRepeatHello: repeat_hello(5.0); break;
      case LeaderAction::kStop: spdlog::info("provider {}: {}", opts_.name, v.reason); return 0;
      case LeaderAction::kFatal: throw common::Error(fmt::format("provider {}: {}", opts_.name, v.reason));
      case LeaderAction::kReport: spdlog::warn("provider {}: {}", opts_.name, v.reason); break;
      case LeaderAction::kIgnore: break;
    }
  }
}

void Leader::contribute(uint64_t r, const torch::Tensor& delta, uint64_t tokens, double compute_s,
                double train_loss) {
  torch::NoGradGuard guard;
  std::vector<uint8_t> frame;
  if (attack_) {
    compress::encode(up_, fragment(r).layout, apply_attack(*attack_, r, delta), frame);
  } else {
    compress::encode(up_, fragment(r).layout, delta, frame);
  }
  bytes_up_ += static_cast<double>(frame.size());
  tokens_ += tokens;  // reported in the next HELLO
  contributed_ = r;
  net::Contribution c;
  c.tokens = tokens;
  c.compute_s = compute_s;
  c.train_loss = train_loss;
  c.payload = net::Frame(std::move(frame));
  downlink_->sent(r, c.payload);  // relay sends each provider the others' frames only
  link_.post(c, r);
}

void Leader::hello(const std::string& hash) {
  link_.post(net::Hello{opts_.name, common::config_hash(cfg_), tokens_, hash, opts_.shard},
             state_.done_round);
  last_hello_ = Clock::now();
  last_hash_ = hash;
}

void Leader::resync(const torch::Tensor& theta_pub, const std::string& why) {
  spdlog::warn("provider {}: rejoining the head ({})", opts_.name, why);
  state_.rejoining = true;
  hello(flat_hash(theta_pub));
}

std::optional<std::string> Leader::take_update(const net::Update& u, uint64_t r, torch::Tensor& theta_pub) {
  bytes_down_ += static_cast<double>(u.bytes());
  return downlink_->take(u, r, opts_.name, theta_pub, fragment(r).layout);
}

void Leader::take_state(const net::Frame& state, torch::Tensor& theta_pub, const common::FlatLayout& layout) {
  compress::decode(dec_, state.data(), state.size(), layout, theta_pub);
  bytes_down_ += static_cast<double>(state.size());
}

void Leader::rejoined(const net::Envelope& env, torch::Tensor& theta_pub,
              const common::FlatLayout& layout, const std::string& why) {
  const auto& w = std::get<net::Welcome>(env.body);
  if (!w.state.empty()) {
    take_state(w.state, theta_pub, layout);
    // Design §2 starts a fresh AdamW state on a full state; the inner state it holds is kept
    // when it continues the run by the rule a restarted provider's saved state follows (a
    // head that went back a round or two to its checkpoint), so that a head restart does not
    // cost every provider a new warm-up.
    const std::string run_config = common::config_hash(cfg_);
    const auto keep = judge_saved_state({contributed_, "", run_config}, env.round,
                                        flat_hash(theta_pub), run_config);
    fresh_state_ = !keep.resume;
    spdlog::info("provider {}: {} ({})", opts_.name,
                 keep.resume ? "keeps its AdamW state and residual" : "starts a fresh AdamW state",
                 keep.reason);
  }
  state_.done_round = env.round;
  state_.rejoining = false;
  spdlog::info("provider {}: {}", opts_.name, why);
}

void Leader::check_head_alive() {
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
  // A HELLO may have gone to a head that died before answering, or been ignored as a
  // repeat (membership.h admit): ask again now and then until a WELCOME comes.
  if (state_.rejoining) repeat_hello(std::max(10.0, cfg_.outer.dead_after_s));
}

}  // namespace xloco::outer
