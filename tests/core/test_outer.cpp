// The DiLoCo outer loop: decisions with an injected clock, the outer optimizer against
// torch::optim::SGD, and whole runs of `xloco local` / `xloco head` on loopback.
#include <nlohmann/json.hpp>
#include "doctest_torch.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "common/config.h"
#include "common/safetensors.h"
#include "helpers.h"
#include "inner/trainer.h"
#include "compress/encoder.h"
#include "compress/torch_adapter.h"
#include "outer/documents.h"
#include "outer/global_model.h"
#include "outer/outer_opt.h"
#include "outer/round.h"

// Last: LibTorch may pull in glog, whose CHECK would shadow doctest's.

using namespace xloco;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using test::jsonl;
using test::run_xloco;

std::string cfg() { return test::env_or("XLOCO_SOURCE_DIR", ".") + "/configs/kjv-tiny.json"; }

std::string outer_small(const std::string& dir, const std::string& name) {
  return " --config " + cfg() + " --set run.dir=" + dir + " --set run.name=" + name +
         " --set model.d_model=32 --set model.n_layer=1 --set model.n_head=2"
         " --set model.seq_len=32 --set inner.batch_size=8 --set inner.warmup_steps=2"
         " --set inner.eval_batches=2 --set inner.log_every=5";
}


std::string provider_hash(const fs::path& run, const std::string& name) {
  for (const auto& r : jsonl(run / "providers" / name / "metrics" / ("provider-" + name + ".jsonl"))) {
    if (r.contains("final")) return r["theta_pub_hash"];
  }
  return "";
}

// θ_pub at the end of the run: the head's (summary.json) and every provider's, all equal.
void check_replicas_agree(const fs::path& run, int providers) {
  const auto summary = json::parse(std::ifstream(run / "summary.json"));
  for (int i = 0; i < providers; ++i) {
    const std::string name = "provider-" + std::to_string(i);
    CHECK_MESSAGE(provider_hash(run, name) == summary["theta_pub_hash"], name);
  }
}

double max_abs_diff(const std::string& a, const std::string& b) {
  const auto fa = common::read_safetensors(a), fb = common::read_safetensors(b);
  double worst = 0;
  REQUIRE(fa.tensors.size() == fb.tensors.size());
  for (const auto& t : fa.tensors) {
    const auto* u = fb.find(t.name);
    REQUIRE(u != nullptr);
    REQUIRE(u->data.size() == t.data.size());
    const auto* x = reinterpret_cast<const float*>(t.data.data());
    const auto* y = reinterpret_cast<const float*>(u->data.data());
    for (size_t i = 0; i < t.data.size() / 4; ++i) worst = std::max(worst, double(std::abs(x[i] - y[i])));
  }
  return worst;
}

}  // namespace

TEST_SUITE("outer") {
  TEST_CASE("decide: closes when all active contributed, at the deadline with min_providers") {
    common::OuterConfig c;
    c.min_providers = 2;
    c.round_timeout_s = 10;
    outer::RoundState s;
    s.round = 3;
    s.started = outer::Clock::time_point{} + std::chrono::seconds(100);
    s.active = {"a", "b", "c"};
    s.contributed = {{"a", 10}};
    auto d = outer::decide(s.started + std::chrono::seconds(1), s, c);
    CHECK(d.action == outer::RoundAction::kWait);
    CHECK(d.reason.find("b, c") != std::string::npos);
    d = outer::decide(s.started + std::chrono::seconds(11), s, c);  // deadline, 1 < min 2
    CHECK(d.action == outer::RoundAction::kWait);
    s.contributed["b"] = 10;
    d = outer::decide(s.started + std::chrono::seconds(5), s, c);
    CHECK(d.action == outer::RoundAction::kWait);
    d = outer::decide(s.started + std::chrono::seconds(11), s, c);
    CHECK(d.action == outer::RoundAction::kClose);
    CHECK(d.reason.find("deadline") != std::string::npos);
    s.contributed["c"] = 10;
    d = outer::decide(s.started + std::chrono::seconds(1), s, c);
    CHECK(d.action == outer::RoundAction::kClose);
    c.providers = 3;
    CHECK(!outer::decide_start(2, c, /*first_round=*/true).start);  // round 1 waits for all K
    CHECK(outer::decide_start(2, c, /*first_round=*/false).start);  // later: min_providers
  }

  TEST_CASE("outer Nesterov SGD matches torch::optim::SGD") {
    common::OuterConfig c;  // lr 0.7, momentum 0.9, nesterov
    torch::manual_seed(3);
    auto theta = torch::randn({1000});
    auto ref = theta.clone().requires_grad_(true);
    torch::optim::SGD sgd({ref}, torch::optim::SGDOptions(0.7).momentum(0.9).nesterov(true));
    outer::OuterOptimizer opt(c, 1000);
    for (int i = 0; i < 5; ++i) {
      auto delta = torch::randn({1000});
      opt.step(theta, delta);
      ref.mutable_grad() = delta.clone();
      sgd.step();
    }
    CHECK(torch::allclose(theta, ref.detach(), 1e-6, 1e-6));
  }

  TEST_CASE("float buffers after averaged_from are set to the providers' average, with no momentum") {
    common::OuterConfig c;  // lr 0.7, momentum 0.9, nesterov
    torch::manual_seed(4);
    auto theta = torch::randn({1000});
    auto ref = theta.narrow(0, 0, 600).clone().requires_grad_(true);
    torch::optim::SGD sgd({ref}, torch::optim::SGDOptions(0.7).momentum(0.9).nesterov(true));
    outer::OuterOptimizer opt(c, 1000, /*averaged_from=*/600);
    for (int i = 0; i < 3; ++i) {
      auto delta = torch::randn({1000});
      const auto averaged = theta.narrow(0, 600, 400) - delta.narrow(0, 600, 400);
      opt.step(theta, delta);
      ref.mutable_grad() = delta.narrow(0, 0, 600).clone();
      sgd.step();
      CHECK(torch::equal(theta.narrow(0, 600, 400), averaged));
    }
    CHECK(torch::allclose(theta.narrow(0, 0, 600), ref.detach(), 1e-6, 1e-6));
    CHECK(opt.momentum().narrow(0, 600, 400).abs().max().item<float>() == 0.0f);
    // non_finite_at walks the same two rules: a huge Δ in the averaged range is caught there.
    auto delta = torch::zeros({1000});
    delta[700] = std::numeric_limits<float>::infinity();
    CHECK(opt.non_finite_at(theta, delta) == std::optional<int64_t>(700));
  }

  TEST_CASE("a round whose outer step would make theta non-finite is discarded: theta, the momentum and theta_pub stay as they were") {
    if (!test::have_kjv()) {
      MESSAGE("skipped: /usr/bin/bible missing (Debian package bible-kjv)");
      return;
    }
    common::Config c = test::tiny_gpt_config();
    c.model.d_model = 32;
    c.model.n_layer = 1;
    c.model.n_head = 2;
    c.model.seq_len = 32;
    c.outer.codec_up = common::CodecKind::kFp32;  // finite values up to FLT_MAX pass the decoder
    c.outer.norm_bound = 0;                       // the norm rule off: this guard alone
    outer::GlobalModel model(c, "");
    const std::string before = model.pub_hash();
    const auto fp32_frame = [&](float value) {
      compress::CodecConfig cc;
      cc.codec = compress::Codec::kFp32;
      cc.error_feedback = false;
      compress::Encoder enc(cc);
      std::vector<uint8_t> out;
      compress::encode(enc, model.layout(), torch::full({model.layout().numel}, value), out);
      return net::Frame(std::move(out));
    };
    model.aggregator().begin({"rogue"});
    CHECK(model.aggregator().add("rogue", fp32_frame(std::numeric_limits<float>::max()), 100).empty());
    const auto closed = model.close_round();
    REQUIRE(closed.discarded);
    CHECK(closed.discarded->find("non-finite") != std::string::npos);
    CHECK(closed.discarded->find("transformer.wte.weight[0]") != std::string::npos);
    model.rehash();
    CHECK(model.pub_hash() == before);  // θ_pub (and θ_true under it) unchanged
    // The next, sound round steps as usual.
    model.aggregator().begin({"p0"});
    CHECK(model.aggregator().add("p0", fp32_frame(1e-3f), 100).empty());
    CHECK(!model.close_round().discarded);
    model.rehash();
    CHECK(model.pub_hash() != before);
  }

  TEST_CASE("K=1, H=1, outer lr 1, momentum 0, fp32 both ways == xloco train (1e-6)") {
    if (!test::have_kjv()) {
      MESSAGE("skipped: /usr/bin/bible missing");
      return;
    }
    test::ScratchDir dir("exact");
    // The design default inner lr (4e-4): AdamW amplifies the outer step's fp32 rounding
    // (theta - (theta - theta_1)) in proportion to the learning rate.
    const std::string lr = " --set inner.lr=4e-4 --set inner.min_lr=4e-5";
    auto t = run_xloco("train" + outer_small(dir.str(), "single") + " --set inner.steps=20" + lr);
    INFO(t.out);
    REQUIRE(t.code == 0);
    auto l = run_xloco("local --providers 1" + outer_small(dir.str(), "diloco") +
                   " --set inner.steps=20 --set outer.inner_steps=1 --set outer.lr=1"
                   " --set outer.momentum=0 --set outer.codec_up=fp32 --set outer.codec_down=fp32"
                   " --set outer.eval_every=0" + lr);
    INFO(l.out);
    REQUIRE(l.code == 0);
    const double diff = max_abs_diff((dir.path / "single/ckpt/step-0000020/model.safetensors").string(),
                                     (dir.path / "diloco/ckpt/round-000020/model.safetensors").string());
    MESSAGE("max |diloco - train| = " << diff);
    CHECK(diff <= 1e-6);
    check_replicas_agree(dir.path / "diloco", 1);
  }

  TEST_CASE("fp32 both ways: theta_pub == theta_true bit for bit; identical data gives identical pseudo-gradients") {
    if (!test::have_kjv()) {
      MESSAGE("skipped: /usr/bin/bible missing");
      return;
    }
    test::ScratchDir dir("fp32");
    auto l = run_xloco("local --providers 2" + outer_small(dir.str(), "r") +
                   " --set inner.steps=12 --set outer.inner_steps=4 --set outer.codec_up=fp32"
                   " --set outer.codec_down=fp32 --set outer.shared_data=true");
    INFO(l.out);
    REQUIRE(l.code == 0);
    check_replicas_agree(dir.path / "r", 2);
    // θ_true (model.safetensors) equals θ_pub (outer.safetensors) bit for bit
    const auto ckpt = dir.path / "r/ckpt/round-000003";
    const auto model = common::read_safetensors((ckpt / "model.safetensors").string());
    const auto outer_st = common::read_safetensors((ckpt / "outer.safetensors").string());
    std::vector<uint8_t> theta_true;
    for (const auto& t : model.tensors) theta_true.insert(theta_true.end(), t.data.begin(), t.data.end());
    CHECK(outer_st.find("theta_pub")->data == theta_true);
    const auto rounds = jsonl(dir.path / "r/metrics/head.jsonl");
    REQUIRE(rounds.size() == 3);
    for (const auto& r : rounds) {
      CHECK(r["frames"]["provider-0"] == r["frames"]["provider-1"]);
    }
  }

  TEST_CASE("int8 both ways: theta_pub is bit-identical on the head and every provider") {
    if (!test::have_kjv()) {
      MESSAGE("skipped: /usr/bin/bible missing");
      return;
    }
    test::ScratchDir dir("int8");
    auto l = run_xloco("local --providers 2" + outer_small(dir.str(), "q") +
                   " --set inner.steps=15 --set outer.inner_steps=5");
    INFO(l.out);
    REQUIRE(l.code == 0);
    check_replicas_agree(dir.path / "q", 2);
    const auto summary = outer::read_document<outer::RunSummary>((dir.path / "q/summary.json").string());
    CHECK(summary.bytes_vs_fp32_dp < 0.1);
    CHECK(l.out.find("final eval loss") != std::string::npos);
  }

  TEST_CASE("reproducible: two xloco local runs with the providers started in different orders end with the same theta_pub and eval loss") {
    if (!test::have_kjv()) {
      MESSAGE("skipped: /usr/bin/bible missing");
      return;
    }
    test::ScratchDir dir("repro");
    const std::string budget = " --set inner.steps=40 --set outer.inner_steps=10 --set outer.eval_every=0";
    std::vector<outer::RunSummary> runs;
    for (const auto& [name, order] : {std::pair{"fwd", "0,1,2"}, std::pair{"rev", "2,1,0"}}) {
      const auto l = run_xloco("local --providers 3 --start-order " + std::string(order) +
                               outer_small(dir.str(), name) + budget);
      INFO(l.out);
      REQUIRE(l.code == 0);
      check_replicas_agree(dir.path / name, 3);
      runs.push_back(outer::read_document<outer::RunSummary>((dir.path / name / "summary.json").string()));
    }
    MESSAGE("theta_pub " << runs[0].theta_pub_hash << " / " << runs[1].theta_pub_hash);
    CHECK(runs[0].theta_pub_hash == runs[1].theta_pub_hash);
    CHECK(runs[0].final_eval_loss == runs[1].final_eval_loss);
    // The shards followed the providers' names, not who connected first.
    for (const auto* name : {"fwd", "rev"}) {
      const auto st = outer::read_document<outer::HeadCheckpointState>(
          (dir.path / name / "ckpt/round-000004/state.json").string());
      for (int i = 0; i < 3; ++i) CHECK(st.members.at("provider-" + std::to_string(i)).shard == i);
    }
  }
}

using test::find_process;
using test::slurp;
using test::start_group;
using test::wait_rounds;

TEST_SUITE("outer_faults") {
  TEST_CASE("SIGTERM to the head checkpoints; --resume continues at the next round with the same theta and momentum") {
    if (!test::have_kjv()) {
      MESSAGE("skipped: /usr/bin/bible missing");
      return;
    }
    test::ScratchDir dir("term");
    const std::string args = "local --providers 1" + outer_small(dir.str(), "t") +
                             " --set inner.steps=4000 --set outer.inner_steps=5"
                             " --set outer.checkpoint_every=1000";
    const auto log = dir.str() + "/first.log";
    const pid_t pid = start_group(args, log);
    test::GroupGuard first(pid);
    REQUIRE(wait_rounds(dir.path / "t/metrics/head.jsonl", 2, pid));
    const pid_t head = find_process(" head --config", pid);  // xloco local's head, in our group
    REQUIRE(head > 0);
    kill(head, SIGTERM);
    int status = first.wait();
    INFO(slurp(log));
    CHECK(WEXITSTATUS(status) == 130);
    std::string latest;
    std::ifstream(dir.path / "t/ckpt/latest") >> latest;
    const auto st = json::parse(std::ifstream(dir.path / "t/ckpt" / latest / "state.json"));
    const uint64_t done = st["round"];
    CHECK(done >= 2);
    CHECK(jsonl(dir.path / "t/metrics/head.jsonl").back()["round"] == done);

    // resume with a shorter budget so it ends soon after
    const auto log2 = dir.str() + "/second.log";
    const std::string args2 = "local --providers 1 --resume" + outer_small(dir.str(), "t") +
                              " --set inner.steps=4000 --set outer.inner_steps=5"
                              " --set outer.checkpoint_every=1000";
    const pid_t pid2 = start_group(args2, log2);
    test::GroupGuard second(pid2);
    REQUIRE(wait_rounds(dir.path / "t/metrics/head.jsonl", done + 2, pid2));
    kill(pid2, SIGINT);
    status = second.wait();
    const auto out2 = slurp(log2);
    INFO(out2);
    CHECK(out2.find("resumed from") != std::string::npos);
    CHECK(out2.find("theta_pub " + st["theta_pub_hash"].get<std::string>()) != std::string::npos);
    CHECK(out2.find("momentum " + st["momentum_hash"].get<std::string>()) != std::string::npos);
    const auto rounds = jsonl(dir.path / "t/metrics/head.jsonl");
    CHECK(rounds[done]["round"] == done + 1);  // the first round after the resume
  }

  TEST_CASE("Ctrl+C on xloco local stops and reaps every child process") {
    if (!test::have_kjv()) {
      MESSAGE("skipped: /usr/bin/bible missing");
      return;
    }
    test::ScratchDir dir("ctrlc");
    const auto log = dir.str() + "/out.log";
    const pid_t pid = start_group("local --providers 2 --nproc 2" + outer_small(dir.str(), "c") +
                                  " --set inner.steps=100000 --set outer.inner_steps=5", log);
    test::GroupGuard guard(pid);
    REQUIRE(wait_rounds(dir.path / "c/metrics/head.jsonl", 1, pid));
    kill(pid, SIGINT);
    int status = 0;
    waitpid(pid, &status, 0);
    INFO(slurp(log));
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 130);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK(kill(-pid, 0) == -1);  // nothing left in the process group
    CHECK(errno == ESRCH);
    CHECK(find_process(dir.str()) == -1);  // nor anywhere else (looked for, never signalled)
    guard.pid = -1;
  }
}
