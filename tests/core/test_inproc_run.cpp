// The real head and K real providers as threads of this process over the in-process transport
// (Gloo's way: ranks as threads, failures collected and reported), with the transport's fault
// injection aimed at them: a provider cut at a round, a contribution delayed past the
// deadline, a duplicated message, the head restarted from its checkpoint. Assertions are on the
// head's verdicts (HeadObserver), its round records and θ_pub hashes, never on log text.
#include <fmt/format.h>
#include "doctest_torch.h"

#include <unistd.h>

#include <algorithm>
#include <set>
#include <atomic>
#include <random>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include "common/checkpoint.h"
#include "common/json_text.h"
#include "common/layout.h"
#include "common/safetensors.h"
#include "compress/decoder.h"
#include "compress/encoder.h"
#include "compress/torch_adapter.h"
#include "helpers.h"
#include "inner/dist.h"
#include "inner/runtime.h"
#include "net/inproc/transport.h"
#include "outer/head/head.h"
#include "outer/provider/link.h"
#include "outer/provider/provider.h"
#include "outer/status/documents.h"
#include "outer/status/status_http.h"

// Last: LibTorch may pull in glog, whose CHECK would shadow doctest's.

using namespace xloco;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using outer::ContributionAction;
using outer::MemberState;

namespace {

common::Config small_run(const std::string& dir, int providers) {
  common::Config c = test::tiny_gpt_config();
  c.run.dir = dir;
  c.run.name = "threads";
  c.model.d_model = 32;
  c.model.n_layer = 1;
  c.model.n_head = 2;
  c.model.seq_len = 32;
  c.inner.steps = 30;
  c.inner.warmup_steps = 2;
  c.inner.eval_batches = 1;
  c.inner.log_every = 10;
  c.outer.inner_steps = 5;  // 6 rounds
  c.outer.providers = providers;
  c.outer.min_providers = 2;
  c.outer.eval_every = 0;  // at the end only
  c.outer.checkpoint_every = 2;
  c.outer.heartbeat_s = 0.1;
  c.outer.dead_after_s = 1.5;
  c.outer.deadline_min_s = 20;  // rounds close on their providers, not on a busy machine's clock
  c.outer.start_grace_s = 600;
  c.outer.head_timeout_s = 4;
  return c;
}

// What a head decided, collected from its observer (which runs on the head's thread).
struct Verdicts {
  std::mutex mu;
  bool keep = true;        // false: count rounds only (the fuzz target's hours of rounds)
  size_t rounds_closed = 0;
  std::vector<std::pair<std::string, outer::Admission>> admissions;
  std::vector<std::tuple<std::string, uint64_t, outer::ContributionVerdict>> contributions;
  std::vector<outer::Transition> transitions;
  std::vector<outer::RoundRecord> rounds;

  bool transition(const std::string& who, MemberState to) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& t : transitions) {
      if (t.name == who && t.to == to) return true;
    }
    return false;
  }
  size_t count(const std::string& who, uint64_t round, ContributionAction action) {
    std::lock_guard<std::mutex> lock(mu);
    size_t n = 0;
    for (const auto& [p, r, v] : contributions) n += p == who && r == round && v.action == action;
    return n;
  }
};

// A head and providers on one in-process network. Provider threads are joined (they end on the
// head's BYE, or outer.head_timeout_s after it went silent) before anything is torn down.
struct ThreadedRun {
  test::ScratchDir dir;
  common::Config cfg;
  std::shared_ptr<net::inproc::Network> network;
  Verdicts verdicts;
  std::function<void(const outer::RoundRecord&)> on_round;  // runs on the head's thread
  std::vector<std::thread> threads;
  std::mutex mu;
  std::map<std::string, std::string> provider_errors;

  ThreadedRun(const std::string& tag, int providers, net::inproc::NetworkOptions options = {})
      : dir(tag), cfg(small_run(dir.str(), providers)), network(net::inproc::Network::create(options)) {
    torch::set_num_threads(1);
    inner::configure_threads(cfg.run, providers + 1);
  }
  ~ThreadedRun() {
    for (auto& t : threads) t.join();
  }

  fs::path run_dir() const { return fs::path(cfg.run.dir) / cfg.run.name; }
  fs::path providers_root;  // where providers keep their files; default RUN_DIR/providers
  fs::path provider_dir(const std::string& name) const {
    return (providers_root.empty() ? run_dir() / "providers" : providers_root) / name;
  }

  std::unique_ptr<outer::Head> head(bool resume = false, bool http = false) {
    outer::HeadOptions o;
    o.run_dir = run_dir().string();
    o.resume = resume;
    if (http) o.http = "127.0.0.1:0";
    o.observer.admission = [this](const std::string& p, const outer::Admission& a) {
      std::lock_guard<std::mutex> lock(verdicts.mu);
      if (verdicts.keep) verdicts.admissions.emplace_back(p, a);
    };
    o.observer.contribution = [this](const std::string& p, uint64_t r, const outer::ContributionVerdict& v) {
      std::lock_guard<std::mutex> lock(verdicts.mu);
      if (verdicts.keep) verdicts.contributions.emplace_back(p, r, v);
    };
    o.observer.transition = [this](const outer::Transition& t) {
      std::lock_guard<std::mutex> lock(verdicts.mu);
      if (verdicts.keep) verdicts.transitions.push_back(t);
    };
    o.observer.round_closed = [this](const outer::RoundRecord& r) {
      {
        std::lock_guard<std::mutex> lock(verdicts.mu);
        ++verdicts.rounds_closed;
        if (verdicts.keep) verdicts.rounds.push_back(r);
      }
      if (on_round) on_round(r);
    };
    return std::make_unique<outer::Head>(cfg, o, network->listen());
  }

  // p0 … p(k − 1) from the start; runs the head to its end and joins every provider. The
  // head's exit code.
  int run_all(outer::Head& head, int k) {
    for (int i = 0; i < k; ++i) provider("p" + std::to_string(i), i);
    const int rc = run_head(head);
    join();
    return rc;
  }

  // p0 and p1 from the start, p2 once round `after` is recorded (set outer.min_providers to 2
  // before head()); runs the head to its end and joins every provider. The head's exit code.
  int run_with_joiner(outer::Head& head, uint64_t after) {
    on_round = [this, after, started = false](const outer::RoundRecord& r) mutable {
      if (r.round == after && !started) {
        started = true;
        provider("p2", 2);
      }
    };
    provider("p0", 0);
    provider("p1", 1);
    const int rc = run_head(head);
    join();
    return rc;
  }

  void provider(const std::string& name, int shard) {
    threads.emplace_back([this, name, shard] {
      try {
        inner::Group solo{inner::DistOptions{}};
        outer::ProviderOptions po{name, provider_dir(name).string(), shard, {}};
        outer::run_provider(cfg, po, solo, network->connect(name));
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        provider_errors[name] = e.what();
      }
    });
  }

  void join() {
    for (auto& t : threads) t.join();
    threads.clear();
  }

  // head.run(), stopped (as a SIGTERM would) if it has not ended after `limit`: a head waits
  // for providers forever, a test must not. Returns its exit code; a stopped head fails.
  int run_head(outer::Head& head, std::chrono::seconds limit = std::chrono::seconds(120)) {
    std::mutex m;
    std::condition_variable done_cv;
    bool done = false, stopped = false;
    std::thread watchdog([&] {
      std::unique_lock<std::mutex> lock(m);
      if (!done_cv.wait_for(lock, limit, [&] { return done; })) {
        stopped = true;
        head.stop();
      }
    });
    const int rc = head.run();
    {
      std::lock_guard<std::mutex> lock(m);
      done = true;
    }
    done_cv.notify_all();
    watchdog.join();
    CHECK_MESSAGE(!stopped, "the head did not finish within " << limit.count() << " s");
    return rc;
  }

  std::string provider_hash(const std::string& name) const {
    for (const auto& r : test::jsonl(provider_dir(name) / "metrics" / ("provider-" + name + ".jsonl"))) {
      if (r.contains("final")) return r["theta_pub_hash"];
    }
    return "";
  }
};

bool contributed(const outer::RoundRecord& r, const std::string& who) { return r.frames.count(who) > 0; }

// What a compromised provider does to its CONTRIBUTION on the way out: `attack` gets the
// message and the values its frame carries (decoded), and rewrites either.
using Tamper = std::function<void(net::Contribution&, const common::FlatLayout&, torch::Tensor&)>;
net::inproc::Faults::Rewrite rogue(const std::string& run, Tamper attack) {
  return [run, attack](const net::Message& m) {
    auto env = net::decode(m, run);
    auto* c = std::get_if<net::Contribution>(&env.body);
    if (c == nullptr) return m;
    compress::Decoder dec;
    const auto info = dec.inspect(c->payload.data(), c->payload.size());
    common::FlatLayout layout;
    for (const auto& t : info.tensors) layout.append(t.name, std::vector<int64_t>(t.shape.begin(), t.shape.end()));
    auto values = torch::empty({layout.numel});
    dec.decode(c->payload.data(), c->payload.size(), compress::refs(layout, values));
    attack(*c, layout, values);
    return net::encode(env);
  };
}

net::Frame frame_as(const common::FlatLayout& layout, const torch::Tensor& values, compress::Codec codec) {
  compress::CodecConfig cc;
  cc.codec = codec;
  cc.block_size = 256;
  cc.error_feedback = false;
  compress::Encoder enc(cc);
  std::vector<uint8_t> out;
  compress::encode(enc, layout, values, out);
  return net::Frame(std::move(out));
}

// The head stops after round 4 as if killed (its providers cut: no BYE gets out) and restarts
// from its checkpoint; the providers rejoin and the run ends with θ_pub agreeing everywhere.
// outer.downlink = relay (outer/round/relay.h) on a topk uplink, outer SGD.
void use_relay(common::Config& c) {
  c.outer.codec_up = common::CodecKind::kTopk;
  c.outer.downlink = common::Downlink::kRelay;
  c.outer.block_size = 256;
  c.outer.topk = 16;
  c.outer.momentum = 0;
  c.outer.lr = 2;
}

// The newest head checkpoint's θ_true (model.safetensors, its parameters in layout order) is
// its θ_pub (outer.safetensors) byte for byte.
bool checkpoint_true_is_pub(const fs::path& run_dir) {
  fs::path newest;
  for (const auto& e : fs::directory_iterator(run_dir / "ckpt")) {
    if (e.path().filename().string().rfind("round-", 0) == 0 && e.path() > newest) newest = e.path();
  }
  const auto outer_file = common::read_safetensors((newest / "outer.safetensors").string());
  const auto* pub = outer_file.find("theta_pub");
  REQUIRE(pub != nullptr);
  const auto model = common::read_safetensors((newest / "model.safetensors").string());
  std::vector<uint8_t> theta_true;
  for (const auto& t : model.tensors) {
    if (theta_true.size() >= pub->size()) break;
    theta_true.insert(theta_true.end(), t.bytes(), t.bytes() + t.size());
  }
  return theta_true.size() == pub->size() &&
         std::equal(theta_true.begin(), theta_true.end(), pub->bytes());
}

void head_restart(common::Overlap overlap, int fragments = 1, bool relay = false) {
  ThreadedRun run(std::string("thr-restart-") + common::to_string(overlap) + "-f" + std::to_string(fragments) + (relay ? "-relay" : ""), 3);
  run.cfg.outer.head_timeout_s = 30;
  run.cfg.outer.overlap = overlap;
  run.cfg.outer.fragments = fragments;
  if (relay) use_relay(run.cfg);
  auto head = run.head();
  outer::Head* first = head.get();
  run.on_round = [&](const outer::RoundRecord& r) {
    if (r.round != 4) return;
    for (int i = 0; i < 3; ++i) run.network->faults().cut("p" + std::to_string(i));  // it dies: no BYE gets out
    first->stop();
  };
  for (int i = 0; i < 3; ++i) run.provider("p" + std::to_string(i), i);
  CHECK(run.run_head(*head) == 130);
  head.reset();
  run.on_round = nullptr;
  {
    std::lock_guard<std::mutex> lock(run.verdicts.mu);
    run.verdicts.admissions.clear();
    run.verdicts.rounds.clear();
  }
  for (int i = 0; i < 3; ++i) run.network->faults().heal("p" + std::to_string(i));
  head = run.head(/*resume=*/true);
  CHECK(run.run_head(*head) == 0);
  run.join();
  CHECK(run.provider_errors.empty());
  REQUIRE(run.verdicts.rounds.size() == 2);
  CHECK(run.verdicts.rounds.front().round == 5);  // the round after the checkpoint
  CHECK(run.verdicts.rounds.back().participants == 3);
  CHECK(run.verdicts.admissions.size() >= 3);  // every provider rejoined the new head
  for (int i = 0; i < 3; ++i) CHECK(run.provider_hash("p" + std::to_string(i)) == head->summary().theta_pub_hash);
  const auto records = outer::read_round_records((run.run_dir() / "metrics/head.jsonl").string());
  for (size_t i = 1; i < records.size(); ++i) CHECK(records[i].round == records[i - 1].round + 1);
  if (relay) CHECK(checkpoint_true_is_pub(run.run_dir()));
}

}  // namespace

TEST_SUITE("inproc_run") {
  TEST_CASE("K=3 threads: every round closes with all three, a duplicated contribution is dropped, theta_pub agrees everywhere") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing (Debian package bible-kjv)");
    }
    ThreadedRun run("thr-dup", 3);
    run.network->faults().duplicate_next("p1", 1, net::inproc::Direction::kFromPeer,
                                         net::MessageType::kContribution);
    auto head = run.head();
    CHECK(run.run_all(*head, 3) == 0);
    CHECK(run.provider_errors.empty());
    REQUIRE(run.verdicts.rounds.size() == 6);
    for (const auto& r : run.verdicts.rounds) {
      CHECK(r.participants == 3);
      CHECK(r.round_wall_s >= r.round_s);  // ROUND_START to the next one covers the collection
      CHECK(r.compute_s <= r.round_wall_s);
      CHECK(r.sync_overhead >= 0);
      CHECK(r.sync_overhead < 1);
    }
    CHECK(run.verdicts.count("p1", 1, ContributionAction::kAccept) == 1);
    CHECK(run.verdicts.count("p1", 1, ContributionAction::kDrop) == 1);  // the copy
    for (int i = 0; i < 3; ++i) CHECK(run.provider_hash("p" + std::to_string(i)) == head->summary().theta_pub_hash);
    for (const auto& [p, a] : run.verdicts.admissions) CHECK(a.shard == p[1] - '0');  // as asked
    // Joining at the run's start, each built θ₀ from the seed itself: no state was sent.
    for (const auto& [p, a] : run.verdicts.admissions) CHECK_MESSAGE(a.sync == outer::SyncAction::kNone, p);
  }

  TEST_CASE("a provider joining one round into the run gets that round's update instead of the state, and theta_pub agrees everywhere") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing (Debian package bible-kjv)");
    }
    // p0 and p1 are 20x slower (the test device), so that round 2 is still running when p2's
    // HELLO comes: the head is then one round past θ₀, which p2 holds.
    setenv("XLOCO_THROTTLE", "p0=20,p1=20", 1);
    struct Unset {
      ~Unset() { unsetenv("XLOCO_THROTTLE"); }
    } unset;
    ThreadedRun run("thr-join-update", 3);
    run.cfg.outer.min_providers = 2;
    run.cfg.outer.start_grace_s = 0;
    auto head = run.head();
    CHECK(run.run_with_joiner(*head, 1) == 0);
    CHECK(run.provider_errors.empty());
    std::lock_guard<std::mutex> lock(run.verdicts.mu);
    for (const auto& [p, a] : run.verdicts.admissions) {
      CAPTURE(p);
      CHECK(a.sync == (p == "p2" ? outer::SyncAction::kUpdate : outer::SyncAction::kNone));
    }
    CHECK(run.verdicts.rounds.back().participants == 3);
    for (const std::string p : {"p0", "p1", "p2"}) {
      CHECK_MESSAGE(run.provider_hash(p) == head->summary().theta_pub_hash, p);
    }
  }

  TEST_CASE("outer.downlink = relay: each provider is sent the others' frames only and applies them itself; theta_pub agrees everywhere and is the head's theta_true") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing (Debian package bible-kjv)");
    }
    ThreadedRun run("thr-relay", 3);
    use_relay(run.cfg);
    auto head = run.head();
    CHECK(run.run_all(*head, 3) == 0);
    CHECK(run.provider_errors.empty());
    REQUIRE(run.verdicts.rounds.size() == 6);
    for (int i = 0; i < 3; ++i) CHECK(run.provider_hash("p" + std::to_string(i)) == head->summary().theta_pub_hash);
    CHECK(checkpoint_true_is_pub(run.run_dir()));
    // outer.relay_mean "present" (each element divided by the weight of those who sent it) and
    // "clipped" (the non-senders credited, relay.h): a different θ each, the same on every
    // replica.
    std::vector<std::string> hashes{head->summary().theta_pub_hash};
    for (const auto mean : {common::RelayMean::kPresent, common::RelayMean::kClipped}) {
      CAPTURE(common::to_string(mean));
      ThreadedRun other(std::string("thr-relay-") + common::to_string(mean), 3);
      use_relay(other.cfg);
      other.cfg.outer.relay_mean = mean;
      auto other_head = other.head();
      CHECK(other.run_all(*other_head, 3) == 0);
      CHECK(other.provider_errors.empty());
      const std::string hash = other_head->summary().theta_pub_hash;
      for (int i = 0; i < 3; ++i) CHECK(other.provider_hash("p" + std::to_string(i)) == hash);
      CHECK(checkpoint_true_is_pub(other.run_dir()));
      for (const auto& h : hashes) CHECK(hash != h);
      hashes.push_back(hash);
    }
    // The round's update holds the three frames (a header beside them); each provider is sent
    // it without its own: 3 × update − Σ frames, to the byte (rounds after the first: nothing
    // else went down).
    const auto& rounds = run.verdicts.rounds;
    for (size_t i = 1; i < rounds.size(); ++i) {
      CAPTURE(rounds[i].round);
      REQUIRE(rounds[i].participants == 3);
      const double up = rounds[i].bytes_up - rounds[i - 1].bytes_up;
      const double down = rounds[i].bytes_down - rounds[i - 1].bytes_down;
      CHECK(up > 0);
      CHECK(down == 3.0 * static_cast<double>(rounds[i].update_bytes) - up);
    }
  }

  TEST_CASE("outer.downlink = relay: the head restarted from its checkpoint; providers rejoin, and theta_pub agrees everywhere") {
    head_restart(common::Overlap::kNone, 1, /*relay=*/true);
  }

  TEST_CASE("a provider cut in round 3 is declared dead; the rounds after close with the others") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing (Debian package bible-kjv)");
    }
    ThreadedRun run("thr-cut", 3);
    run.network->faults().fail_at("p2", 3);
    auto head = run.head();
    for (int i = 0; i < 3; ++i) run.provider("p" + std::to_string(i), i);
    CHECK(run.run_head(*head) == 0);
    run.join();
    CHECK(run.verdicts.transition("p2", MemberState::kDead));
    REQUIRE(run.verdicts.rounds.size() == 6);
    for (const auto& r : run.verdicts.rounds) {
      if (r.round < 3) CHECK(r.participants == 3);
      if (r.round > 3) {
        CHECK(r.participants == 2);
        CHECK(!contributed(r, "p2"));
      }
    }
    CHECK(run.provider_hash("p0") == head->summary().theta_pub_hash);
    CHECK(run.provider_hash("p1") == head->summary().theta_pub_hash);
    CHECK(run.provider_errors.count("p2") == 1);  // gave up on a silent head
  }

  TEST_CASE("a contribution delayed past the deadline is dropped as late; its round closes without it and the provider straggles") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing (Debian package bible-kjv)");
    }
    // Messages in flight count against the head's mailbox (capacity 8): 0.6 s of heartbeats
    // every 0.1 s do not fit, so senders' messages wait in their outboxes, and no one waits.
    ThreadedRun run("thr-late", 3);
    run.cfg.outer.deadline_min_s = 0.3;
    run.cfg.outer.deadline_multiple = 2;
    run.cfg.outer.dead_after_s = 5;  // its heartbeats are late too, but it is not dead
    run.cfg.inner.steps = 200;  // 40 rounds: a straggler is not waited for, so rounds go on fast
    run.on_round = [&](const outer::RoundRecord& r) {
      if (r.round == 2) run.network->faults().delay("p1", 600ms, net::inproc::Direction::kFromPeer);
    };
    auto head = run.head();
    for (int i = 0; i < 3; ++i) run.provider("p" + std::to_string(i), i);
    CHECK(run.run_head(*head) == 0);
    run.join();
    REQUIRE(run.verdicts.rounds.size() == 40);
    bool closed_without = false;
    for (const auto& r : run.verdicts.rounds) {
      if (r.round <= 2) continue;
      closed_without = closed_without || (!contributed(r, "p1") && r.reason.find("deadline") != std::string::npos);
    }
    CHECK(closed_without);
    CHECK(run.verdicts.transition("p1", MemberState::kStraggling));
    size_t late = 0;
    for (uint64_t r = 3; r <= 40; ++r) late += run.verdicts.count("p1", r, ContributionAction::kDrop);
    CHECK(late >= 1);
    CHECK(!run.verdicts.transition("p1", MemberState::kDead));
  }

  TEST_CASE("the head restarted from its checkpoint: providers rejoin and the run ends with theta_pub agreeing everywhere") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing (Debian package bible-kjv)");
    }
    head_restart(common::Overlap::kNone);
  }

  TEST_CASE("outer.overlap = delayed: the head restarted from its checkpoint; providers drop the round they trained ahead, rejoin, and theta_pub agrees everywhere") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing (Debian package bible-kjv)");
    }
    head_restart(common::Overlap::kDelayed);
  }

  TEST_CASE("outer.fragments = 2, delayed: the head restarted from its checkpoint; providers rejoin, and theta_pub agrees everywhere") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing (Debian package bible-kjv)");
    }
    head_restart(common::Overlap::kDelayed, 2);
  }

  TEST_CASE("outer.overlap = delayed: providers train ahead of the head; one joining at round 3 counts from the round after, and theta_pub agrees everywhere") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing (Debian package bible-kjv)");
    }
    for (const int fragments : {1, 2}) {
    CAPTURE(fragments);
    ThreadedRun run("thr-delayed-join-f" + std::to_string(fragments), 3);
    run.cfg.outer.fragments = fragments;
    run.cfg.outer.overlap = common::Overlap::kDelayed;
    run.cfg.outer.min_providers = 2;
    run.cfg.outer.start_grace_s = 0;  // round 1 starts with the two there
    auto head = run.head();
    CHECK(run.run_with_joiner(*head, 2) == 0);
    CHECK(run.provider_errors.empty());
    std::lock_guard<std::mutex> lock(run.verdicts.mu);
    REQUIRE(run.verdicts.rounds.size() == 6);
    CHECK(run.verdicts.rounds.front().participants == 2);
    CHECK(run.verdicts.rounds.back().participants == 3);  // the joiner counts
    for (const auto& r : run.verdicts.rounds) CHECK_MESSAGE(r.discarded.empty(), r.discarded);
    for (const std::string p : {"p0", "p1", "p2"}) {
      CHECK_MESSAGE(run.provider_hash(p) == head->summary().theta_pub_hash, p);
    }
    // p0 and p1 trained rounds 2..6 ahead of the head; p2, from its second round on.
    const auto metrics = [&](const std::string& p) { return run.provider_dir(p) / "metrics" / ("provider-" + p + ".jsonl"); };
    CHECK(test::chained_rounds(metrics("p0")) == 5);
    CHECK(test::chained_rounds(metrics("p1")) == 5);
    CHECK(test::chained_rounds(metrics("p2")) >= 1);
    }
  }

  TEST_CASE("evaluation runs beside the rounds: none waits for it, one slower than a round is skipped saying why, and theta_pub is the same as without evaluation") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing (Debian package bible-kjv)");
    }
    const auto run_once = [](const std::string& tag, int eval_every, int eval_batches) {
      ThreadedRun run(tag, 2);
      run.cfg.inner.steps = 60;  // 12 rounds
      run.cfg.outer.eval_every = eval_every;
      run.cfg.inner.eval_batches = eval_batches;
      auto head = run.head();
      for (int i = 0; i < 2; ++i) run.provider("p" + std::to_string(i), i);
      CHECK(run.run_head(*head) == 0);
      run.join();
      const auto records = outer::read_round_records((run.run_dir() / "metrics/head.jsonl").string());
      return std::make_tuple(head->summary().theta_pub_hash, head->summary().final_eval_loss, records);
    };
    // Evaluating 400 batches takes far longer than a round of these tiny steps.
    const auto [with_hash, with_loss, records] = run_once("thr-eval", 1, 400);
    const auto [plain_hash, plain_loss, plain] = run_once("thr-noeval", 0, 400);
    CHECK(with_hash == plain_hash);  // updates held back during evaluations changed nothing
    CHECK(with_loss == plain_loss);  // the last round's evaluation is the same one
    REQUIRE(records.size() == 12);
    size_t skipped = 0;
    for (size_t i = 0; i < records.size(); ++i) {
      CHECK(records[i].round == i + 1);                 // in order, every round once
      CHECK(!records[i].theta_pub_hash.empty());        // hashed once its update was applied
      CHECK((records[i].eval_loss.has_value() != records[i].eval_skipped.has_value()));
      skipped += records[i].eval_skipped.has_value();
      CHECK(records[i].round_wall_s < 5.0);             // no round waited for an evaluation
    }
    MESSAGE(skipped << " of 12 evaluations skipped, each for outlasting a round");
    CHECK(skipped >= 1);
    CHECK(records.back().eval_loss.has_value());       // the last one is always done
    CHECK(plain.back().eval_loss == records.back().eval_loss);
  }

  TEST_CASE("reproducible: the same config and seed give the same theta_pub whatever order the providers connect and contribute in") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing (Debian package bible-kjv)");
    }
    const auto run_once = [](const std::string& tag, const std::vector<int>& start, const std::string& slow) {
      ThreadedRun run(tag, 3);
      run.network->faults().delay(slow, 150ms, net::inproc::Direction::kFromPeer);
      auto head = run.head();
      for (const int i : start) {
        run.provider("p" + std::to_string(i), i);
        std::this_thread::sleep_for(50ms);
      }
      CHECK(run.run_head(*head) == 0);
      run.join();
      REQUIRE(run.verdicts.rounds.size() == 6);
      return std::make_pair(head->summary().theta_pub_hash, head->summary().final_eval_loss);
    };
    const auto a = run_once("thr-order-a", {0, 1, 2}, "p2");
    const auto b = run_once("thr-order-b", {2, 1, 0}, "p0");
    CHECK(a.first == b.first);
    CHECK(a.second == b.second);
  }

  TEST_CASE("a hostile provider cannot move theta: its tokens, codec, norm and overflowing values are each refused by name, every round closes with the others, and theta_pub is bit for bit the run without it") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing (Debian package bible-kjv)");
    }
    struct Outcome {
      std::string hash;
      double loss = 0;
      std::vector<outer::RoundRecord> rounds;
      outer::RunSummary summary;
      std::string metrics, table;
    };
    const auto run_once = [](const std::string& tag, const Tamper& attack) {
      ThreadedRun run(tag, 4);
      run.cfg.outer.min_providers = 3;
      run.cfg.outer.start_grace_s = 2;  // the run without the rogue starts with three
      // The refusal rules alone: under outer.norm_clip the rogue's norm is one of the median's,
      // so honest clip factors (and θ) would differ from the run without it by design.
      run.cfg.outer.norm_clip = false;
      auto head = run.head(false, /*http=*/true);
      if (attack) run.network->faults().tamper("p3", rogue(run.cfg.run.name, attack));
      for (int i = 0; i < (attack ? 4 : 3); ++i) run.provider("p" + std::to_string(i), i);
      CHECK(run.run_head(*head) == 0);  // the head stayed up to the end
      Outcome o;
      std::string url;
      std::ifstream(run.run_dir() / "status.url") >> url;
      o.metrics = outer::http_get(url, "/metrics");
      o.table = outer::status_table(nlohmann::json::parse(outer::http_get(url, "/status")).get<outer::HeadStatus>());
      run.join();
      o.hash = head->summary().theta_pub_hash;
      o.loss = head->summary().final_eval_loss;
      o.summary = head->summary();
      std::lock_guard<std::mutex> lock(run.verdicts.mu);
      o.rounds = run.verdicts.rounds;
      return o;
    };
    const Outcome honest = run_once("thr-honest", nullptr);
    REQUIRE(honest.rounds.size() == 6);
    struct Case {
      const char* name;
      const char* code;
      const char* says;
      Tamper attack;
    };
    const std::vector<Case> cases = {
        {"tokens = 2^64 - 1", "bad_tokens", "the round's schedule allows",
         [](net::Contribution& c, const common::FlatLayout&, torch::Tensor&) { c.tokens = UINT64_MAX; }},
        {"an fp32 frame of 1e30 in an int8 run", "bad_frame", "its codec is fp32",
         [](net::Contribution& c, const common::FlatLayout& l, torch::Tensor& v) {
           c.payload = frame_as(l, torch::full_like(v, 1e30f), compress::Codec::kFp32);
         }},
        {"its own values x 1000", "outlier", "the median",
         [](net::Contribution& c, const common::FlatLayout& l, torch::Tensor& v) {
           c.payload = frame_as(l, v * 1000, compress::Codec::kInt8);
         }},
        {"values at the edge of fp32 (theta would overflow)", "outlier", "the median",
         [](net::Contribution& c, const common::FlatLayout& l, torch::Tensor& v) {
           c.payload = frame_as(l, torch::full_like(v, 1.6e38f), compress::Codec::kInt8);
         }},
        // Its refusal quotes the name: unescaped, serialising it (wire, head.jsonl, /status)
        // threw and ended the head (issue 52).
        {"a tensor name of bytes that are not UTF-8 or printable", "bad_frame", "tensor 0 is \\xff\\xfe\\x1b[2J",
         [](net::Contribution& c, const common::FlatLayout& l, torch::Tensor& v) {
           common::FlatLayout renamed;
           for (size_t i = 0; i < l.slots.size(); ++i) {
             renamed.append(i == 0 ? "\xff\xfe\x1b[2J" + l.slots[i].name : l.slots[i].name, l.slots[i].shape);
           }
           c.payload = frame_as(renamed, v, compress::Codec::kInt8);
         }},
    };
    for (const auto& k : cases) {
      CAPTURE(k.name);
      const Outcome o = run_once(std::string("thr-rogue-") + k.code, k.attack);
      for (const auto& r : o.rounds) {  // what reached head.jsonl and /status is printable ASCII
        for (const auto& [who, why] : r.refused) CHECK(why.find('\x1b') == std::string::npos);
      }
      REQUIRE(o.rounds.size() == 6);
      size_t refused = 0;
      for (const auto& r : o.rounds) {
        CHECK(r.participants == 3);  // every honest round closed with the honest three
        CHECK(!contributed(r, "p3"));
        CHECK(r.discarded.empty());
        if (r.refused.count("p3")) {
          ++refused;
          CHECK(r.refused.at("p3").find(k.says) != std::string::npos);
        }
      }
      CHECK(refused >= 4);  // from its first round on (it may join in round 2)
      CHECK(o.summary.refused.count(k.code) == 1);
      CHECK(o.summary.refused.at(k.code) >= refused);
      CHECK(o.metrics.find(fmt::format("xloco_refused_total{{run=\"threads\",code=\"{}\"}}", k.code)) != std::string::npos);
      CHECK(o.table.find(std::string(" ") + k.code) != std::string::npos);
      CHECK(o.hash == honest.hash);  // nothing of the rogue reached theta
      CHECK(o.loss == honest.loss);
    }
  }

  TEST_CASE("the head's disk fills up mid-run: it keeps training, reports the failed checkpoints, writes them again once space returns, and a restart resumes from the last complete one") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing (Debian package bible-kjv)");
    }
    test::ScratchDir mount_point("tmpfs");
    const std::string mp = mount_point.str();
    if (::geteuid() != 0 || std::system(("mount -t tmpfs -o size=3m xloco-test " + mp + " 2>/dev/null").c_str()) != 0) {
      XLOCO_SKIP_CASE("mounting a tmpfs needs root (CAP_SYS_ADMIN)");
    }
    struct Unmount {
      std::string at;
      ~Unmount() { (void)std::system(("umount -l " + at).c_str()); }
    } unmount{mp};
    ThreadedRun run("thr-disk", 2);
    run.cfg.run.dir = mp;  // the head's run directory on the small tmpfs
    run.providers_root = run.dir.path / "providers";
    run.cfg.inner.steps = 50;  // 10 rounds
    run.cfg.outer.checkpoint_every = 1;
    run.cfg.outer.keep_checkpoints = 2;
    const fs::path filler = fs::path(mp) / "filler";
    run.on_round = [&](const outer::RoundRecord& r) {
      if (r.round == 3) {  // fill the disk to the last byte
        std::FILE* f = std::fopen(filler.c_str(), "w");
        std::vector<char> block(64 << 10, 'x');
        while (f && std::fwrite(block.data(), 1, block.size(), f) == block.size()) {
        }
        if (f) std::fclose(f);
      }
      if (r.round == 6) fs::remove(filler);  // space returns
    };
    auto head = run.head();
    for (int i = 0; i < 2; ++i) run.provider("p" + std::to_string(i), i);
    CHECK(run.run_head(*head) == 0);  // every round, full disk or not
    run.join();
    CHECK(run.provider_errors.empty());
    const auto summary = head->summary();
    CHECK(summary.rounds == 10);
    CHECK(summary.checkpoint_failures >= 1);
    head.reset();
    const fs::path ckpt = run.run_dir() / "ckpt";
    for (const auto& e : fs::directory_iterator(ckpt)) CHECK(e.path().filename().string().rfind(".tmp-", 0) != 0);
    // head.jsonl lost nothing: the lines that could not be written waited for space
    const auto records = outer::read_round_records((run.run_dir() / "metrics/head.jsonl").string());
    REQUIRE(records.size() == 10);
    for (size_t i = 0; i < records.size(); ++i) CHECK(records[i].round == i + 1);
    // A crash mid-checkpoint leaves a temp directory; a restart removes it and resumes from
    // the newest complete checkpoint (the end of the run).
    fs::create_directories(ckpt / ".tmp-round-000011-99999");
    run.on_round = nullptr;
    auto again = run.head(/*resume=*/true);
    CHECK(!fs::exists(ckpt / ".tmp-round-000011-99999"));
    CHECK(common::latest_checkpoint(ckpt.string()) == (ckpt / "round-000010").string());
  }

  // Found by the 101 M-parameter rehearsal: a provider's heartbeats went out before its HELLO
  // (while it hashed its θ), and a head slow to start (building its own model) read them all
  // at once, answered each "not a member: send HELLO", and the provider took the answer as a
  // refusal and exited.
  TEST_CASE("a provider's link sends no heartbeat before its first post (the HELLO)") {
    common::Config cfg = small_run("unused", 1);
    cfg.outer.heartbeat_s = 0.05;
    auto network = net::inproc::Network::create({});
    auto head = network->listen();
    outer::Link link(network->connect("p0"), cfg);
    std::this_thread::sleep_for(400ms);  // eight heartbeat periods before anything is posted
    link.post(net::Hello{"p0", "hash", 0, "", 0}, 0);
    std::vector<net::MessageType> seen;
    for (auto end = std::chrono::steady_clock::now() + 2s; seen.size() < 3 && std::chrono::steady_clock::now() < end;) {
      if (auto rx = head->receive(50ms)) seen.push_back(net::decode(rx->message, cfg.run.name).type());
    }
    REQUIRE(seen.size() == 3);
    CHECK(seen[0] == net::MessageType::kHello);
    CHECK(seen[1] == net::MessageType::kHeartbeat);  // and the heartbeats follow it
  }

  TEST_CASE("a provider joining takes a 'not a member: send HELLO' answer to a message ahead of its HELLO as no refusal, and joins") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing (Debian package bible-kjv)");
    }
    ThreadedRun run("thr-join-rejoin-reply", 1);
    auto head = run.network->listen();  // a head played by the test
    run.provider("p0", 0);
    bool welcomed = false;
    for (auto end = std::chrono::steady_clock::now() + 60s; !welcomed && std::chrono::steady_clock::now() < end;) {
      auto rx = head->receive(100ms);
      if (!rx || !std::holds_alternative<net::Hello>(net::decode(rx->message, run.cfg.run.name).body)) continue;
      // What a head answers to a heartbeat it read before this HELLO, then the WELCOME, then
      // the end of the run (the provider stops on it; a silent head would end it after
      // outer.head_timeout_s, as an error).
      for (net::Body b : {net::Body{net::ErrorReply{net::RefusalCode::kRejoin, "heartbeat from p0, which is not a member: send HELLO"}},
                          net::Body{net::Welcome{{}, 0, 1}}, net::Body{net::Bye{"the test ends the run"}}}) {
        CHECK(head->send(rx->peer, net::encode(net::Envelope{run.cfg.run.name, 0, std::move(b)})) == net::SendStatus::kSent);
      }
      welcomed = true;
    }
    run.join();
    CHECK(welcomed);
    CHECK_MESSAGE(run.provider_errors.empty(), (run.provider_errors.empty() ? "" : run.provider_errors.begin()->second));
  }
}

// The protocol fuzz target (issue 52): the real head's message handling, driven over the
// in-process transport by an allow-listed peer ("p9") that sends mutations of real messages —
// p0's own HELLO, HEARTBEATs and CONTRIBUTIONs, recorded on their way, and one of every other
// type — while p0 trains beside it. The head must stay up, keep closing rounds, and answer.
// XLOCO_FUZZ_SECONDS sets the length (20 s by default; RESULTS quotes a 10-minute run),
// XLOCO_FUZZ_SEED the seed (printed, so a failure can be replayed), XLOCO_FUZZ_H the round.
namespace {

net::Message mutate(const net::Message& m, std::mt19937_64& rng, uint64_t round) {
  net::Message out = m;
  const auto pick = [&](uint64_t n) { return n == 0 ? 0 : std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); };
  const auto bytes_of = [](const net::Frame& f) { return std::vector<uint8_t>(f.data(), f.data() + f.size()); };
  const int edits = static_cast<int>(pick(4));
  for (int e = 0; e < edits; ++e) {
    switch (pick(9)) {
      case 0: {  // a field of the header set to something else
        auto h = nlohmann::json::parse(out.empty() ? std::string_view("x") : out[0].view(), nullptr, false);
        if (!h.is_object()) break;
        static const char* kFields[] = {"v", "type", "run", "round", "tokens", "compute_s", "provider",
                                        "config_hash", "theta_pub_hash", "shard", "reason", "code", "step"};
        const std::string f = kFields[pick(13)];
        const nlohmann::json values[] = {round, round + 1, 0, -1, 1e300, "", std::string(300, 'x'), "\u00e9\u001b[2J",
                                         nlohmann::json::array({1, 2}), nullptr, UINT64_MAX, true, "HELLO",
                                         "CONTRIBUTION", "rejoin", "outlier"};
        h[f] = values[pick(16)];
        out[0] = net::Frame(std::string_view(common::json_dump(h)));
        break;
      }
      case 1: case 2: {  // bytes flipped, in the header or a binary frame
        if (out.empty()) break;
        const size_t i = pick(out.size());
        auto b = bytes_of(out[i]);
        if (b.empty()) break;
        for (uint64_t k = 0, n = 1 + pick(8); k < n; ++k) b[pick(b.size())] = static_cast<uint8_t>(pick(256));
        out[i] = net::Frame(std::move(b));
        break;
      }
      case 3: {  // cut short
        if (out.empty()) break;
        const size_t i = pick(out.size());
        auto b = bytes_of(out[i]);
        b.resize(pick(b.size() + 1));
        out[i] = net::Frame(std::move(b));
        break;
      }
      case 4: {  // bytes that are not UTF-8 spliced into the header
        if (out.empty()) break;
        std::string h(out[0].view());
        h.insert(pick(h.size() + 1), std::string("\xff\xfe\xc3\x28", 1 + pick(4)));
        out[0] = net::Frame(std::string_view(h));
        break;
      }
      case 5: out.push_back(out.empty() ? net::Frame(std::string_view("{}")) : out.back()); break;  // a frame too many
      case 6: if (!out.empty()) out.pop_back(); break;                                              // one too few
      case 7: {  // a binary frame's tail grown with garbage
        if (out.size() < 2) break;
        auto b = bytes_of(out[1]);
        for (uint64_t k = 0, n = pick(4096); k < n; ++k) b.push_back(static_cast<uint8_t>(pick(256)));
        out[1] = net::Frame(std::move(b));
        break;
      }
      default: break;  // as it was: a replay
    }
  }
  return out;
}

// This process's resident set now (VmRSS), 0 when unknown.
int64_t current_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return 0;
}

// One fuzz run: `seconds` of mutated messages from p9 (seed `seed`) beside `honest` honest
// providers with rounds of H = `h`; checks that the head stayed up, answered and kept closing
// rounds.
void fuzz_head(double seconds, uint64_t seed, int h, int honest) {
  MESSAGE("fuzz seed " << seed << ", " << seconds << " s, " << honest << " honest (replay with XLOCO_FUZZ_SEED)");
  ThreadedRun run("thr-fuzz", honest + 1);
  run.verdicts.keep = false;  // nothing of the test's grows with the rounds: RSS is the run's
  run.cfg.outer.inner_steps = h;
  run.cfg.inner.steps = h * 100000;  // runs until stopped
  run.cfg.outer.min_providers = 1;
  run.cfg.outer.start_grace_s = 1;
  run.cfg.outer.deadline_min_s = 0.5;
  run.cfg.outer.round_timeout_s = 5;
  run.cfg.outer.checkpoint_every = 1000000;
  auto head = run.head(false, /*http=*/true);
  // p0's messages as they leave, for the corpus.
  std::mutex corpus_mu;
  std::vector<net::Message> corpus;
  size_t recorded = 0;
  run.network->faults().tamper("p0", [&](const net::Message& m) {
    std::lock_guard<std::mutex> lock(corpus_mu);
    if (corpus.size() < 64) corpus.push_back(m);
    else corpus[5 + recorded % 59] = m;  // keeps the newest (contributions of this round)
    ++recorded;
    return m;
  });
  const std::string rn = run.cfg.run.name;
  for (net::Body b : {net::Body{net::Welcome{{}, 0, 2}}, net::Body{net::RoundStart{}}, net::Body{net::Bye{"fuzz"}},
                      net::Body{net::ErrorReply{net::RefusalCode::kOutlier, "fuzz"}}, net::Body{net::Update{}}}) {
    corpus.push_back(net::encode(net::Envelope{rn, 1, std::move(b)}));
  }
  run.provider("p0", 0);
  if (honest > 1) run.provider("p1", 1);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> sent{0}, answers{0};
  std::thread fuzzer([&] {
    std::mt19937_64 rng(seed);
    auto link = run.network->connect("p9");
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!stop && std::chrono::steady_clock::now() < end) {
      net::Message m;
      uint64_t r = 1;
      {
        std::lock_guard<std::mutex> lock(corpus_mu);
        m = corpus[std::uniform_int_distribution<size_t>(0, corpus.size() - 1)(rng)];
        std::lock_guard<std::mutex> vlock(run.verdicts.mu);
        r = run.verdicts.rounds_closed + 1;
      }
      const auto bad = mutate(m, rng, r);
      if (bad.empty()) continue;  // nothing to send: a transport refuses it on this side
      (void)link->send(net::kHeadPeer, bad);
      ++sent;
      while (auto rx = link->receive(std::chrono::milliseconds(0))) ++answers;
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
  });
  // The process's RSS (head, providers and the test) once the run has warmed up, at a quarter
  // of the time, and at the end: growth per round and per message, for the leak check.
  std::atomic<int64_t> rss_warm{0}, rss_end{0};
  std::atomic<uint64_t> rounds_warm{0}, sent_warm{0};
  std::thread stopper([&] {
    const auto warm = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds / 4);
    while (std::chrono::steady_clock::now() < warm && !stop) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    rss_warm = current_rss_bytes();
    sent_warm = sent.load();
    {
      std::lock_guard<std::mutex> lock(run.verdicts.mu);
      rounds_warm = run.verdicts.rounds_closed;
    }
    fuzzer.join();
    rss_end = current_rss_bytes();
    head->stop();
  });
  int rc = -1;
  CHECK_NOTHROW(rc = head->run());
  stopper.join();
  stop = true;
  run.join();
  CHECK(rc == 130);  // stopped by the test, not ended by a peer
  size_t rounds = 0;
  {
    std::lock_guard<std::mutex> lock(run.verdicts.mu);
    rounds = run.verdicts.rounds_closed;
  }
  MESSAGE(sent.load() << " messages sent, " << answers.load() << " answers, " << rounds << " rounds closed");
  const double grew_mb = static_cast<double>(rss_end - rss_warm) / 1e6;
  const uint64_t later_rounds = rounds - rounds_warm, later_sent = sent - sent_warm;
  MESSAGE(fmt::format("RSS {:.1f} MB after the first quarter, {:.1f} MB at the end: {:+.1f} MB over the last {} rounds "
                      "and {} messages ({:+.2f} kB a round, {:+.3f} kB a message)",
                      static_cast<double>(rss_warm) / 1e6, static_cast<double>(rss_end) / 1e6, grew_mb, later_rounds,
                      later_sent, later_rounds ? grew_mb * 1e3 / static_cast<double>(later_rounds) : 0.0,
                      later_sent ? grew_mb * 1e3 / static_cast<double>(later_sent) : 0.0));
  CHECK(sent > 1000);
  CHECK(answers > 0);              // it was answered (refusals), not silenced
  CHECK(rounds >= seconds / (10.0 * h));  // and rounds kept closing beside it
}

}  // namespace

TEST_SUITE("fuzz_head") {
  TEST_CASE("protocol fuzz: an allow-listed peer sending mutated real messages cannot end, stall or silence the head") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing (Debian package bible-kjv)");
    }
    const double seconds = std::getenv("XLOCO_FUZZ_SECONDS") ? std::atof(std::getenv("XLOCO_FUZZ_SECONDS")) : 20;
    const uint64_t seed = std::getenv("XLOCO_FUZZ_SEED") ? std::strtoull(std::getenv("XLOCO_FUZZ_SEED"), nullptr, 10)
                                                         : static_cast<uint64_t>(std::random_device{}());
    // XLOCO_FUZZ_H: inner steps a round (5 by default: rounds close every few tens of ms, so
    // the round paths are fuzzed too; larger makes rounds rare, for a memory profile of the
    // message paths alone).
    const int h = std::getenv("XLOCO_FUZZ_H") ? std::max(1, std::atoi(std::getenv("XLOCO_FUZZ_H"))) : 5;
    // Two honest providers and the fuzzer: the fuzzer is a minority (design §10), so the norm
    // quorum (more than half of a round's providers) is there without it. XLOCO_FUZZ_HONEST=1
    // runs one (the fuzzer is then half of the run, which the quorum does not cover: rounds
    // still close, with or without an update).
    const int honest = std::getenv("XLOCO_FUZZ_HONEST") ? std::clamp(std::atoi(std::getenv("XLOCO_FUZZ_HONEST")), 1, 2) : 2;
    fuzz_head(seconds, seed, h, honest);
  }

  // The liveness gap the fuzz target found (2026-12-05): with one honest provider beside it,
  // the fuzzer's HELLOs took it out of each round after the quorum had counted it, the honest
  // contribution was refused for want of a quorum, and a round whose every contribution was
  // refused never closed (0 rounds in 20 s). Rounds now close, without an update if need be.
  TEST_CASE("protocol fuzz replay: seed 537317148 with one honest provider, where rounds never closed") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing (Debian package bible-kjv)");
    }
    fuzz_head(8, 537317148, 5, 1);
  }

  // Found by the fuzz target with one honest provider beside it: a provider refused for a bad
  // frame still counted toward the norm quorum, so with two providers the honest one's
  // contribution was refused for want of a quorum in every round and θ never moved.
  TEST_CASE("liveness: one of two providers sends frames that fail the head's checks: every round closes with the other's contribution accepted and theta moves") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing (Debian package bible-kjv)");
    }
    ThreadedRun run("thr-half", 2);
    auto head = run.head();
    run.network->faults().tamper("p1", rogue(run.cfg.run.name, [](net::Contribution& c, const common::FlatLayout& l, torch::Tensor& v) {
      c.payload = frame_as(l, v, compress::Codec::kFp32);  // an fp32 frame in an int8 run: bad_frame
    }));
    CHECK(run.run_all(*head, 2) == 0);
    std::lock_guard<std::mutex> lock(run.verdicts.mu);
    REQUIRE(run.verdicts.rounds.size() == 6);
    std::set<std::string> hashes;
    for (const auto& r : run.verdicts.rounds) {
      CAPTURE(r.round);
      CHECK(contributed(r, "p0"));
      CHECK(!r.refused.count("p0"));
      CHECK(r.refused.count("p1"));
      CHECK(r.reason.find("no contribution accepted") == std::string::npos);
      hashes.insert(r.theta_pub_hash);
    }
    CHECK(hashes.size() == 6);  // θ moved every round
  }
}
