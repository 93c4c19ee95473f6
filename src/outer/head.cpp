#include "outer/head.h"

#include <malloc.h>

#include <chrono>
#include <deque>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/metrics.h"
#include "common/process.h"
#include "compress/error.h"
#include "inner/data.h"
#include "inner/model.h"
#include "inner/trainer.h"
#include "net/protocol.h"
#include "outer/outer_opt.h"
#include "outer/round.h"
#include "outer/status_http.h"
#include "outer/sync.h"

namespace xloco::outer {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Member {
  int shard = -1;
  MemberState state = MemberState::kDead;  // not live until its HELLO
  std::string reason;                      // why it is in that state
  Clock::time_point last_seen{};           // epoch until its first HELLO to this head process
  uint64_t last_round = 0;                 // last round it contributed to
  uint64_t tokens = 0;
  uint64_t step = 0;                       // from its heartbeats
  double tokens_per_s = 0;                 // from its heartbeats
  double bytes_up = 0, bytes_down = 0;
  double compute_s = 0;                    // inner compute of its last contribution
  std::string address;                     // IP address of its last HELLO, as the head sees it
  std::deque<double> round_s;              // its recent round times (ROUND_START → CONTRIBUTION)
};

constexpr size_t kRoundTimesKept = 5;

// The head's allocator policy. It does not train: its large transients (codec frames,
// received contributions, per-tensor codec buffers) are better mmapped and returned on free
// than kept in the heap as main() sets up for training, where they stay resident and fragment
// (RESULTS, issue 5: 5.1x -> 4.8x of the parameter bytes).
constexpr int kHeadMmapThreshold = 1 << 20;

// Evaluation, though, frees and re-allocates the same activation-sized buffers batch after
// batch; mmapped, every batch page-faults them back in (the demo's evaluation outlasted a
// round: sync overhead 0.15 % -> 6.8 %). So the heap while evaluating, handed back after.
struct HeapWhileEvaluating {
  HeapWhileEvaluating() { mallopt(M_MMAP_THRESHOLD, 32 << 20); }
  ~HeapWhileEvaluating() {
    mallopt(M_MMAP_THRESHOLD, kHeadMmapThreshold);
    malloc_trim(0);
  }
  HeapWhileEvaluating(const HeapWhileEvaluating&) = delete;
  HeapWhileEvaluating& operator=(const HeapWhileEvaluating&) = delete;
};

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

struct Head::Impl {
  common::Config cfg;
  HeadOptions opts;
  std::unique_ptr<net::Transport> net;
  inner::Group solo{inner::DistOptions{}};
  std::unique_ptr<inner::Dataset> data;
  std::unique_ptr<inner::InnerTrainer> evaluator;  // its params() are θ_pub
  torch::Tensor theta_true, delta;
  torch::Tensor scratch;       // only for a contribution whose token count differs (lazy)
  double ref_tokens = 0;       // tokens of the round's first contribution: weight 1
  double weight_sum = 0;       // Σ tokens_i / ref_tokens over the round's contributions
  std::unique_ptr<OuterOptimizer> opt;
  compress::Encoder down_enc, state_enc;
  compress::Decoder dec;
  std::map<std::string, Member> members;
  RoundState round;
  bool in_round = false;
  uint64_t done_rounds = 0;
  int total = 0;
  common::JsonlWriter metrics;
  HeadSummary summary;
  Clock::time_point t0 = Clock::now();
  std::string last_wait_reason;
  uint64_t late_contributions = 0;
  uint64_t resumed_from = 0;
  bool first_round = true;
  json frame_hashes = json::object();  // provider -> BLAKE2b of its contribution this round
  std::string pub_hash, prev_hash;     // θ_pub's hash now and before the last update
  net::Frame last_update;              // the last UPDATE, for a provider one round behind
  std::optional<double> last_eval;
  Clock::time_point last_heartbeat = Clock::now(), last_publish{}, last_listen = Clock::now();
  std::unique_ptr<StatusServer> status;

  Impl(const common::Config& c, HeadOptions o, std::unique_ptr<net::Transport> t)
      : cfg(c), opts(std::move(o)), net(std::move(t)), down_enc(downlink_codec(c.outer)),
        state_enc(full_state_codec()) {
    total = common::total_rounds(cfg);
    data = inner::make_dataset(cfg, {0, 1});
    evaluator = std::make_unique<inner::InnerTrainer>(cfg, inner::make_model(cfg), solo,
                                                      torch::Device(torch::kCPU));
    torch::Tensor& pub = evaluator->params();
    opt = std::make_unique<OuterOptimizer>(cfg.outer, pub.numel());
    if (!opts.init.empty()) {
      evaluator->load_model(common::read_safetensors(opts.init + "/model.safetensors"));
      spdlog::info("warm start from {}", opts.init);
    }
    theta_true = pub.clone();
    const auto old = common::latest_checkpoint(ckpt_root());
    if (opts.auto_resume) {
      spdlog::info("auto-resume: {}", old ? "continuing from " + *old
                                          : "no checkpoint under " + ckpt_root() + ", starting the run");
    }
    if (opts.resume || (opts.auto_resume && old)) {
      resume();
    } else if (old) {
      throw common::ConfigError(fmt::format(
          "run directory {} already holds checkpoint {}: pass --resume to continue it, or choose "
          "another run.name (nothing was changed)", opts.run_dir, *old));
    }
    metrics.open((fs::path(opts.run_dir) / "metrics" / "head.jsonl").string());
    pub_hash = evaluator->param_hash();
    if (!opts.http.empty()) {
      status = std::make_unique<StatusServer>(opts.http);
      common::write_file_atomic((fs::path(opts.run_dir) / "status.url").string(), status->url() + "\n");
      spdlog::info("status: {}/status and {}/metrics (xloco status --head {})", status->url(),
                   status->url(), status->url());
    }
  }

  const Slots& slots() const { return evaluator->slots(); }
  torch::Tensor& pub() { return evaluator->params(); }
  std::string ckpt_root() const { return (fs::path(opts.run_dir) / "ckpt").string(); }

  // ------------------------------------------------------------------ checkpoints
  void checkpoint() {
    common::CheckpointContents c;
    for (const auto& s : slots()) {
      c.files["model.safetensors"].push_back(
          inner::view_blob(s.name, theta_true.narrow(0, s.offset, s.numel).view(s.shape)));
    }
    c.files["outer.safetensors"] = {inner::view_blob("momentum", opt->momentum()),
                                    inner::view_blob("theta_pub", pub())};
    json m = json::object();
    for (const auto& [name, mem] : members) m[name] = {{"shard", mem.shard}, {"tokens", mem.tokens}};
    c.state = {{"round", done_rounds},
               {"run", cfg.run.name},
               {"config", common::to_json(cfg)},
               {"config_hash", common::config_hash(cfg)},
               {"members", m},
               {"theta_pub_hash", evaluator->param_hash()},
               {"momentum_hash", common::hash_hex(opt->momentum().data_ptr(),
                                                  static_cast<size_t>(opt->momentum().numel()) * 4)},
               {"bytes_up", summary.bytes_up},
               {"bytes_down", summary.bytes_down}};
    const auto dir = common::write_checkpoint(ckpt_root(), fmt::format("round-{:06d}", done_rounds),
                                              c, cfg.outer.keep_checkpoints);
    spdlog::info("checkpoint {}", dir);
  }

  void resume() {
    const auto dir = common::latest_checkpoint(ckpt_root());
    XLOCO_ENFORCE(dir.has_value(), common::IoError, "--resume: no checkpoint under {}", ckpt_root());
    const auto state = common::read_checkpoint_state(*dir);
    XLOCO_ENFORCE(state.value("config_hash", "") == common::config_hash(cfg), common::ConfigError,
                  "--resume: {} was written with a different config (hash {} vs {})", *dir,
                  state.value("config_hash", ""), common::config_hash(cfg));
    const auto outer_file = common::read_safetensors(*dir + "/outer.safetensors");
    const auto* mom = outer_file.find("momentum");
    const auto* tp = outer_file.find("theta_pub");
    XLOCO_ENFORCE(mom && tp, common::IoError, "{}/outer.safetensors lacks momentum/theta_pub", *dir);
    evaluator->load_model(common::read_safetensors(*dir + "/model.safetensors"));
    theta_true.copy_(pub());
    pub().copy_(inner::from_blob(*tp));
    opt->momentum().copy_(inner::from_blob(*mom));
    XLOCO_ENFORCE(evaluator->param_hash() == state.value("theta_pub_hash", ""), common::IoError,
                  "{}: theta_pub does not match its hash in state.json", *dir);
    done_rounds = state.value("round", uint64_t{0});
    resumed_from = done_rounds;
    const auto& mom_t = opt->momentum();
    XLOCO_ENFORCE(common::hash_hex(mom_t.data_ptr(), static_cast<size_t>(mom_t.numel()) * 4) ==
                      state.value("momentum_hash", ""),
                  common::IoError, "{}: outer momentum does not match its hash in state.json", *dir);
    summary.bytes_up = state.value("bytes_up", 0.0);
    summary.bytes_down = state.value("bytes_down", 0.0);
    const json listed = state.value("members", json::object());
    for (const auto& [name, m] : listed.items()) {
      members[name].shard = m.value("shard", -1);
      members[name].tokens = m.value("tokens", uint64_t{0});
    }
    spdlog::info("resumed from {}: round {} done, theta_pub {}, momentum {}", *dir, done_rounds,
                 evaluator->param_hash(), state.value("momentum_hash", ""));
  }

  // ------------------------------------------------------------------ messages
  void send(const std::string& peer, net::Body body, uint64_t r) {
    net::Envelope env{cfg.run.name, r, std::move(body)};
    const auto st = net->send(peer, net::encode(env));
    if (st == net::SendStatus::kSent) return;
    spdlog::warn("send {} to {}: {}", net::to_string(env.type()), peer, net::to_string(st));
    auto it = members.find(peer);
    if (st == net::SendStatus::kNoPeer && it != members.end() && is_live(it->second.state)) {
      set_state(peer, it->second, MemberState::kDead, "connection lost");
    }
  }

  void set_state(const std::string& name, Member& m, MemberState s, const std::string& why) {
    if (m.state != s) {
      const bool quiet = m.state == MemberState::kJoining && s == MemberState::kActive;
      if (!quiet) {
        const auto level = s == MemberState::kDead || s == MemberState::kStraggling
                               ? spdlog::level::warn
                               : spdlog::level::info;
        spdlog::log(level, "provider {}: {} -> {} ({})", name, to_string(m.state), to_string(s), why);
      }
    }
    m.state = s;
    m.reason = why;
    if (!is_live(s) && in_round && !round.contributed.count(name)) round.active.erase(name);
  }

  size_t live_count() const {
    size_t n = 0;
    for (const auto& [name, m] : members) n += is_live(m.state) ? 1 : 0;
    return n;
  }

  void refuse(const std::string& peer, const std::string& code, const std::string& why) {
    spdlog::warn("refused {}: {}", peer, why);
    send(peer, net::ErrorReply{code, why}, done_rounds);
  }

  int assign_shard(const std::string& name) {
    auto& m = members[name];
    if (m.shard >= 0) return m.shard;
    std::vector<bool> used(static_cast<size_t>(cfg.outer.providers), false);
    if (cfg.outer.shared_data) {
      return m.shard = 0;  // every provider trains on the same data (replica checks)
    }
    for (const auto& [n, other] : members) {
      if (other.shard >= 0 && other.shard < cfg.outer.providers) used[other.shard] = true;
    }
    for (int s = 0; s < cfg.outer.providers; ++s) {
      if (!used[s]) return m.shard = s;
    }
    return -1;
  }

  void on_hello(const std::string& peer, const net::Hello& h, const std::string& address) {
    if (h.config_hash != common::config_hash(cfg)) {
      refuse(peer, "config_hash", fmt::format("provider {} has config hash {}, the run has {}", peer,
                                              h.config_hash, common::config_hash(cfg)));
      return;
    }
    const int shard = assign_shard(peer);
    if (shard < 0) {
      refuse(peer, "full", fmt::format("all {} shards are taken; raise outer.providers",
                                       cfg.outer.providers));
      return;
    }
    auto& m = members[peer];
    const bool fresh = m.last_seen == Clock::time_point{};
    m.last_seen = Clock::now();
    m.address = address;
    // A (re)joining provider takes part from the next round; work it already handed in counts.
    if (in_round && !round.contributed.count(peer)) round.active.erase(peer);
    const SyncAction action = sync_for(h.theta_pub_hash, pub_hash, prev_hash, !last_update.empty());
    net::Welcome w;
    w.shard_index = static_cast<uint32_t>(shard);
    w.shard_count = cfg.outer.shared_data ? 1u : static_cast<uint32_t>(cfg.outer.providers);
    std::string how;
    if (action == SyncAction::kFullState) {
      auto frame = state_enc.encode(const_views(pub(), slots()));
      m.bytes_down += static_cast<double>(frame.size());
      summary.bytes_down += static_cast<double>(frame.size());
      w.state = net::Frame(std::move(frame));
      how = "full state";
    } else if (action == SyncAction::kUpdate) {
      send(peer, net::Update{last_update}, done_rounds);  // before the WELCOME: order is kept
      m.bytes_down += static_cast<double>(last_update.size());
      summary.bytes_down += static_cast<double>(last_update.size());
      how = "one round behind: sent the last update";
    } else {
      how = "already current";
    }
    send(peer, w, done_rounds);
    const std::string verb = fresh ? "joined" : "rejoined";
    if (fresh) m.state = MemberState::kJoining;  // a newcomer has no state to leave
    set_state(peer, m, MemberState::kJoining,
              fmt::format("{} at round {} ({}), shard {}", verb, done_rounds, how, shard));
    spdlog::info("provider {} {} at round {} from {} (shard {}/{}, {}), {} live", peer, verb,
                 done_rounds, address.empty() ? "?" : address, shard, cfg.outer.providers, how,
                 live_count());
  }

  void on_contribution(const std::string& peer, uint64_t r, const net::Contribution& c) {
    auto it = members.find(peer);
    if (it == members.end() || !is_live(it->second.state)) {
      refuse(peer, "rejoin", fmt::format("contribution from {}, which is not a member (never "
                                         "joined, declared dead, or the head restarted): send HELLO",
                                         peer));
      return;
    }
    const uint64_t open = in_round ? round.round : done_rounds + 1;
    if (r > open || r == 0) {
      refuse(peer, "future_round", fmt::format("contribution of {} for round {}, but the head is at "
                                               "round {}", peer, r, open));
      return;
    }
    if (!in_round || r < round.round || round.contributed.count(peer)) {
      ++late_contributions;
      spdlog::warn("dropped a contribution from {} for round {} (round {} is {}): {}", peer, r,
                   open, in_round ? "open" : "not started",
                   round.contributed.count(peer) && r == round.round ? "duplicate" : "late, its round has closed");
      return;
    }
    if (!round.active.count(peer)) {
      spdlog::warn("dropped a contribution from {} for round {}: it joined after the round started",
                   peer, r);
      return;
    }
    if (c.tokens == 0) {
      refuse(peer, "bad_tokens", fmt::format("contribution of {} for round {} claims 0 tokens", peer, r));
      return;
    }
    // Δ accumulates Σ (tokens_i / tokens_first) · deq_i. Providers share H and the batch, so
    // the weights are 1 and each frame is decoded straight into Δ: no model-sized buffer.
    const double tokens = static_cast<double>(c.tokens);
    const double w = ref_tokens == 0 ? 1.0 : tokens / ref_tokens;
    if (ref_tokens == 0) {
      // Allocated at the first contribution, by when the provider has received its WELCOME:
      // the head never holds Δ and a full fp32 state in flight at the same time at start-up.
      if (!delta.defined()) delta = torch::empty_like(pub());
      delta.zero_();
    }
    try {
      if (w == 1.0) {
        dec.decode_add(c.payload.data(), c.payload.size(), views(delta, slots()));
      } else {
        if (!scratch.defined()) scratch = torch::empty_like(delta);
        dec.decode(c.payload.data(), c.payload.size(), views(scratch, slots()));
        delta.add_(scratch, w);
      }
    } catch (const compress::FrameError& e) {
      refuse(peer, "bad_frame", fmt::format("contribution of {} for round {}: {}", peer, r, e.what()));
      return;
    }
    if (ref_tokens == 0) ref_tokens = tokens;
    weight_sum += w;
    round.contributed[peer] = c.tokens;
    frame_hashes[peer] = common::hash_hex(c.payload.data(), c.payload.size());
    auto& m = it->second;
    m.reason = fmt::format("contributed to round {}", r);
    m.round_s.push_back(seconds_since(round.started));
    if (m.round_s.size() > kRoundTimesKept) m.round_s.pop_front();
    if (m.state == MemberState::kStraggling) {
      set_state(peer, m, MemberState::kActive, fmt::format("on time again in round {}", r));
    }
    m.last_round = r;
    m.tokens += c.tokens;
    m.bytes_up += static_cast<double>(c.payload.size());
    m.compute_s = c.compute_s;
    summary.bytes_up += static_cast<double>(c.payload.size());
  }

  void handle(const net::Received& rx) {
    net::Envelope env;
    try {
      env = net::decode(rx.message, cfg.run.name);
    } catch (const net::ProtocolError& e) {
      refuse(rx.peer, net::to_string(e.kind()), fmt::format("bad message from {}: {}", rx.peer, e.what()));
      return;
    }
    if (auto it = members.find(rx.peer); it != members.end() && is_live(it->second.state)) {
      it->second.last_seen = Clock::now();
    }
    std::visit(
        [&](const auto& body) {
          using T = std::decay_t<decltype(body)>;
          if constexpr (std::is_same_v<T, net::Hello>) {
            on_hello(rx.peer, body, rx.address);
          } else if constexpr (std::is_same_v<T, net::Contribution>) {
            on_contribution(rx.peer, env.round, body);
          } else if constexpr (std::is_same_v<T, net::Bye>) {
            if (auto it = members.find(rx.peer); it != members.end()) {
              set_state(rx.peer, it->second, MemberState::kLeft, "said goodbye: " + body.reason);
            }
          } else if constexpr (std::is_same_v<T, net::ErrorReply>) {
            spdlog::warn("provider {} reports an error: {} ({})", rx.peer, body.reason, body.code);
          } else if constexpr (std::is_same_v<T, net::Heartbeat>) {
            auto it = members.find(rx.peer);
            if (it == members.end() || !is_live(it->second.state)) {
              refuse(rx.peer, "rejoin", fmt::format("heartbeat from {}, which is not a member "
                                                    "(declared dead, or the head restarted): send "
                                                    "HELLO", rx.peer));
            } else {
              it->second.step = body.step;
              it->second.tokens_per_s = body.tokens_per_s;
            }
          } else {
            refuse(rx.peer, "unexpected", fmt::format("{} from a provider", net::to_string(env.type())));
          }
        },
        env.body);
  }

  // ------------------------------------------------------------------ rounds
  void start_round() {
    round = RoundState{};
    round.round = done_rounds + 1;
    round.started = Clock::now();
    std::vector<double> recent;
    for (auto& [name, m] : members) {
      if (!is_live(m.state)) continue;
      round.active.insert(name);
      recent.insert(recent.end(), m.round_s.begin(), m.round_s.end());
      if (m.state == MemberState::kJoining) {
        set_state(name, m, MemberState::kActive, fmt::format("in round {}", round.round));
      }
    }
    round.deadline_s = round_deadline_s(recent, cfg.outer);
    ref_tokens = 0;
    weight_sum = 0;
    in_round = true;
    last_wait_reason.clear();
    const std::set<std::string> to_start = round.active;  // a failed send edits round.active
    for (const auto& p : to_start) send(p, net::RoundStart{}, round.round);
  }

  void close_round(const std::string& reason) {
    const double collect_s = seconds_since(round.started);
    double compute_s = 0;
    for (const auto& [p, tok] : round.contributed) compute_s = std::max(compute_s, members[p].compute_s);
    delta.div_(weight_sum);
    opt->step(theta_true, delta);
    last_update = {};  // the previous round's update is stale now: never hold two frames
    std::vector<uint8_t> frame;
    if (cfg.outer.codec_down == "fp32") {
      down_enc.encode(const_views(theta_true, slots()), frame);
    } else {
      torch::sub_out(delta, theta_true, pub());  // Δ is spent: reuse its memory
      down_enc.encode(const_views(delta, slots()), frame);
    }
    for (const auto& p : round.active) {
      if (round.contributed.count(p)) continue;
      auto& m = members[p];
      set_state(p, m, MemberState::kStraggling,
                fmt::format("missed round {} ({})", round.round, reason));
    }
    apply_update(dec, frame, cfg.outer, pub(), slots());
    net::Frame shared(std::move(frame));
    last_update = shared;
    for (auto& [name, m] : members) {
      if (!is_live(m.state)) continue;
      send(name, net::Update{shared}, round.round);
      m.bytes_down += static_cast<double>(shared.size());
      summary.bytes_down += static_cast<double>(shared.size());
    }
    in_round = false;
    done_rounds = round.round;
    json rec = {{"round", done_rounds},
                {"participants", round.contributed.size()},
                {"reason", reason},
                {"bytes_up", summary.bytes_up},
                {"bytes_down", summary.bytes_down},
                {"update_bytes", shared.size()},
                {"round_s", collect_s},
                {"compute_s", compute_s},
                {"comm_s", std::max(0.0, collect_s - compute_s)},
                {"frames", frame_hashes},
                {"deadline_s", round.deadline_s},
                {"late_contributions", late_contributions}};
    frame_hashes = json::object();
    const bool last = static_cast<int>(done_rounds) >= total;
    // The next round starts before the head evaluates or checkpoints, so providers never wait
    // for either: both overlap the providers' inner steps.
    // Wall of the round: from its ROUND_START to the next one (the update is out by now).
    rec["round_wall_s"] = seconds_since(round.started);
    rec["sync_overhead"] = std::max(0.0, 1.0 - compute_s / rec["round_wall_s"].get<double>());
    if (!last) try_start_round();
    prev_hash = pub_hash;
    pub_hash = evaluator->param_hash();
    rec["theta_pub_hash"] = pub_hash;
    if (last || (cfg.outer.eval_every > 0 && done_rounds % cfg.outer.eval_every == 0)) {
      const auto e = [&] {
        HeapWhileEvaluating heap;
        return evaluator->evaluate(*data, [this] { pump(); });
      }();
      rec["eval_loss"] = e.loss;
      if (e.accuracy) rec["eval_accuracy"] = *e.accuracy;
      summary.final_eval_loss = e.loss;
      last_eval = e.loss;
    }
    metrics.write(rec);
    const double elapsed = seconds_since(t0);
    spdlog::info("round {}/{} | {} providers | {} up | {} down | round {:.2f}s {}| ETA {}", done_rounds,
                 total, rec["participants"].get<size_t>(), common::human_bytes(summary.bytes_up),
                 common::human_bytes(summary.bytes_down), collect_s,
                 rec.contains("eval_loss") ? fmt::format("| eval {:.4f} ", rec["eval_loss"].get<double>()) : "",
                 common::human_duration(elapsed / static_cast<double>(done_rounds - resumed_from) *
                                        (total - done_rounds)));
    if (!last && cfg.outer.checkpoint_every > 0 && done_rounds % cfg.outer.checkpoint_every == 0) {
      checkpoint();
    }
  }

  // Starts the next round when enough providers are live; otherwise says why (once).
  void try_start_round() {
    const auto d = decide_start(live_count(), cfg.outer, first_round, seconds_since(t0));
    if (d.start) {
      first_round = false;
      start_round();
    } else if (d.reason != last_wait_reason) {
      spdlog::info("{}", d.reason);
      last_wait_reason = d.reason;
    }
  }

  int run() {
    common::install_forwarding_handlers();
    mallopt(M_MMAP_THRESHOLD, kHeadMmapThreshold);
    mallopt(M_TRIM_THRESHOLD, 8 << 20);
    spdlog::info("head: run {} | {} rounds of H={} | codec up {} down {} | waiting for {} providers",
                 cfg.run.name, total, cfg.outer.inner_steps, cfg.outer.codec_up,
                 cfg.outer.codec_down, cfg.outer.providers);
    while (static_cast<int>(done_rounds) < total) {
      if (common::pending_signal() != 0) {
        spdlog::warn("head interrupted after round {}; checkpointing", done_rounds);
        checkpoint();
        say_goodbye("head interrupted");
        return 130;
      }
      if (auto rx = net->receive(std::chrono::milliseconds(50))) handle(*rx);
      forgive_deafness();
      housekeeping();
      if (!in_round) {
        try_start_round();
        continue;
      }
      const auto d = decide(Clock::now(), round, cfg.outer);
      if (d.action == RoundAction::kClose) {
        close_round(d.reason);
      } else if (d.overdue && d.reason != last_wait_reason) {
        spdlog::warn("round {}: {}", round.round, d.reason);
        last_wait_reason = d.reason;
      }
    }
    publish_status("done");
    summary.rounds = static_cast<int>(done_rounds);
    summary.wall_s = seconds_since(t0);
    summary.param_hash = evaluator->param_hash();
    const double steps = static_cast<double>(cfg.inner.steps);
    summary.fp32_dp_bytes = 2.0 * fp32_bytes(pub()) * steps * cfg.outer.providers;
    checkpoint();
    say_goodbye("run complete");
    write_summary();
    return 0;
  }

  // While the head evaluates: answer what is waiting (HELLO, contributions to the round in
  // progress, heartbeats) and keep heartbeats and /status going. Rounds close only in run().
  void pump() {
    while (auto rx = net->receive(std::chrono::milliseconds(0))) handle(*rx);
    forgive_deafness();
    housekeeping();
  }

  // A provider is silent only if the head was listening: after anything that kept the loop
  // away (a checkpoint's fsync, a slow evaluation step), that time does not count against it.
  void forgive_deafness() {
    const auto now = Clock::now();
    const auto gap = now - last_listen;
    last_listen = now;
    if (gap < std::chrono::seconds(1)) return;
    for (auto& [name, m] : members) {
      if (is_live(m.state)) m.last_seen = std::min(now, m.last_seen + gap);
    }
  }

  // Liveness (silent providers are dead), heartbeats to the live ones, the status snapshot.
  void housekeeping() {
    const auto now = Clock::now();
    for (auto& [name, m] : members) {
      if (is_live(m.state) && is_silent(now, m.last_seen, cfg.outer)) {
        set_state(name, m, MemberState::kDead,
                  fmt::format("silent for {:.1f}s (outer.dead_after_s {:g})",
                              std::chrono::duration<double>(now - m.last_seen).count(),
                              cfg.outer.dead_after_s));
      }
    }
    if (std::chrono::duration<double>(now - last_heartbeat).count() >= cfg.outer.heartbeat_s) {
      last_heartbeat = now;
      for (const auto& [name, m] : members) {
        if (is_live(m.state)) send(name, net::Heartbeat{}, done_rounds);
      }
    }
    if (std::chrono::duration<double>(now - last_publish).count() >= 0.25) {
      last_publish = now;
      publish_status(in_round ? "running" : (first_round ? "waiting" : "paused"));
    }
  }

  json status_json(const std::string& state) const {
    const auto now = Clock::now();
    json providers = json::array();
    for (const auto& [name, m] : members) {
      providers.push_back({{"name", name},
                           {"address", m.address},
                           {"state", to_string(m.state)},
                           {"reason", m.reason},
                           {"up", is_live(m.state) ? 1 : 0},
                           {"shard", m.shard},
                           {"last_round", m.last_round},
                           {"step", m.step},
                           {"tokens", m.tokens},
                           {"tokens_per_s", m.tokens_per_s},
                           {"bytes_up", m.bytes_up},
                           {"bytes_down", m.bytes_down},
                           {"last_seen_s", m.last_seen == Clock::time_point{}
                                               ? -1.0
                                               : std::chrono::duration<double>(now - m.last_seen).count()}});
    }
    json s = {{"run", cfg.run.name},
              {"state", state},
              {"reason", in_round ? decide(now, round, cfg.outer).reason : last_wait_reason},
              {"round", done_rounds},
              {"round_in_progress", in_round ? round.round : 0},
              {"total_rounds", total},
              {"deadline_s", in_round ? round.deadline_s : 0.0},
              {"bytes_up", summary.bytes_up},
              {"bytes_down", summary.bytes_down},
              {"late_contributions", late_contributions},
              {"uptime_s", seconds_since(t0)},
              {"theta_pub_hash", pub_hash},
              {"providers", providers}};
    s["eval_loss"] = last_eval ? json(*last_eval) : json(nullptr);
    return s;
  }

  void publish_status(const std::string& state) {
    if (status) status->publish(status_json(state));
  }

  void say_goodbye(const std::string& why) {
    for (const auto& [name, m] : members) {
      if (is_live(m.state)) send(name, net::Bye{why}, done_rounds);
    }
  }

  void write_summary() {
    const json s = {{"rounds", summary.rounds},
                    {"final_eval_loss", summary.final_eval_loss},
                    {"bytes_up", summary.bytes_up},
                    {"bytes_down", summary.bytes_down},
                    {"fp32_dp_bytes", summary.fp32_dp_bytes},
                    {"bytes_vs_fp32_dp", (summary.bytes_up + summary.bytes_down) / summary.fp32_dp_bytes},
                    {"wall_s", summary.wall_s},
                    {"theta_pub_hash", summary.param_hash},
                    {"head_peak_rss_bytes", common::peak_rss_bytes()},
                    {"param_bytes", fp32_bytes(pub())},
                    {"late_contributions", late_contributions}};
    const auto path = opts.summary_file.empty() ? (fs::path(opts.run_dir) / "summary.json").string()
                                                : opts.summary_file;
    common::write_file_atomic(path, s.dump(2) + "\n");
    spdlog::info("done: {} rounds, final eval loss {:.4f}, {} up, {} down ({:.5f} of fp32 data "
                 "parallel), theta_pub {}",
                 summary.rounds, summary.final_eval_loss, common::human_bytes(summary.bytes_up),
                 common::human_bytes(summary.bytes_down), s["bytes_vs_fp32_dp"].get<double>(),
                 summary.param_hash);
  }
};

Head::Head(const common::Config& config, HeadOptions options,
           std::unique_ptr<net::Transport> transport)
    : impl_(std::make_unique<Impl>(config, std::move(options), std::move(transport))) {}
Head::~Head() = default;
int Head::run() { return impl_->run(); }
const HeadSummary& Head::summary() const { return impl_->summary; }

}  // namespace xloco::outer
