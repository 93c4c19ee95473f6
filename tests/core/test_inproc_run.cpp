// The real head and K real providers as threads of this process over the in-process transport
// (Gloo's way: ranks as threads, failures collected and reported), with the transport's fault
// injection aimed at them: a provider cut at a round, a contribution delayed past the
// deadline, a duplicated message, the head restarted from its checkpoint. Assertions are on the
// head's verdicts (HeadObserver), its round records and θ_pub hashes, never on log text.
#include <torch/torch.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

#include "helpers.h"
#include "inner/dist.h"
#include "inner/runtime.h"
#include "net/inproc/transport.h"
#include "outer/documents.h"
#include "outer/head.h"
#include "outer/provider.h"

// Last: LibTorch may pull in glog, whose CHECK would shadow doctest's.
#include <doctest/doctest.h>

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

  fs::path run_dir() const { return dir.path / cfg.run.name; }

  std::unique_ptr<outer::Head> head(bool resume = false) {
    outer::HeadOptions o;
    o.run_dir = run_dir().string();
    o.resume = resume;
    o.observer.admission = [this](const std::string& p, const outer::Admission& a) {
      std::lock_guard<std::mutex> lock(verdicts.mu);
      verdicts.admissions.emplace_back(p, a);
    };
    o.observer.contribution = [this](const std::string& p, uint64_t r, const outer::ContributionVerdict& v) {
      std::lock_guard<std::mutex> lock(verdicts.mu);
      verdicts.contributions.emplace_back(p, r, v);
    };
    o.observer.transition = [this](const outer::Transition& t) {
      std::lock_guard<std::mutex> lock(verdicts.mu);
      verdicts.transitions.push_back(t);
    };
    o.observer.round_closed = [this](const outer::RoundRecord& r) {
      {
        std::lock_guard<std::mutex> lock(verdicts.mu);
        verdicts.rounds.push_back(r);
      }
      if (on_round) on_round(r);
    };
    return std::make_unique<outer::Head>(cfg, o, network->listen());
  }

  void provider(const std::string& name, int shard) {
    threads.emplace_back([this, name, shard] {
      try {
        inner::Group solo{inner::DistOptions{}};
        outer::ProviderOptions po{name, (run_dir() / "providers" / name).string(), shard};
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
    for (const auto& r : test::jsonl(run_dir() / "providers" / name / "metrics" / ("provider-" + name + ".jsonl"))) {
      if (r.contains("final")) return r["theta_pub_hash"];
    }
    return "";
  }
};

bool contributed(const outer::RoundRecord& r, const std::string& who) { return r.frames.count(who) > 0; }

}  // namespace

TEST_SUITE("inproc_run") {
  TEST_CASE("K=3 threads: every round closes with all three, a duplicated contribution is dropped, theta_pub agrees everywhere") {
    if (!test::have_kjv()) {
      MESSAGE("skipped: /usr/bin/bible missing (Debian package bible-kjv)");
      return;
    }
    ThreadedRun run("thr-dup", 3);
    run.network->faults().duplicate_next("p1", 1, net::inproc::Direction::kFromPeer,
                                         net::MessageType::kContribution);
    auto head = run.head();
    for (int i = 0; i < 3; ++i) run.provider("p" + std::to_string(i), i);
    CHECK(run.run_head(*head) == 0);
    run.join();
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
  }

  TEST_CASE("a provider cut in round 3 is declared dead; the rounds after close with the others") {
    if (!test::have_kjv()) {
      MESSAGE("skipped: /usr/bin/bible missing (Debian package bible-kjv)");
      return;
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
      MESSAGE("skipped: /usr/bin/bible missing (Debian package bible-kjv)");
      return;
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
      MESSAGE("skipped: /usr/bin/bible missing (Debian package bible-kjv)");
      return;
    }
    ThreadedRun run("thr-restart", 3);
    run.cfg.outer.head_timeout_s = 30;
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
  }

  TEST_CASE("evaluation runs beside the rounds: none waits for it, one slower than a round is skipped saying why, and theta_pub is the same as without evaluation") {
    if (!test::have_kjv()) {
      MESSAGE("skipped: /usr/bin/bible missing (Debian package bible-kjv)");
      return;
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
      MESSAGE("skipped: /usr/bin/bible missing (Debian package bible-kjv)");
      return;
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
}
