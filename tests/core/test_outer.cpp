// The DiLoCo outer loop: decisions with an injected clock, the outer optimizer against
// torch::optim::SGD, and whole runs of `xloco local` / `xloco head` on loopback.
#include <nlohmann/json.hpp>
#include "doctest_torch.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "common/config.h"
#include "common/safetensors.h"
#include "compress/encoder.h"
#include "compress/error.h"
#include "compress/torch_adapter.h"
#include "helpers.h"
#include "inner/trainer.h"
#include "outer/head/global_model.h"
#include "outer/head/membership.h"
#include "outer/round/advise.h"
#include "outer/round/aggregate.h"
#include "outer/round/outer_opt.h"
#include "outer/round/pace.h"
#include "outer/round/relay.h"
#include "outer/status/documents.h"
#include <cstring>
#include "inner/data.h"
#include "inner/dist.h"
#include "inner/model.h"
#include "outer/round/round.h"
#include "outer/round/sync.h"

// Last: LibTorch may pull in glog, whose CHECK would shadow doctest's.

using namespace xloco;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using test::jsonl;
using test::run_xloco;

// A run (its own process) against the rule recomputed here: the same float32 steps, but BLAS
// kernels may round differently between the two processes (LibTorch 2.x's MKL: 1.2e-6 and 2.1e-6
// measured; OpenBLAS on 1.13: below 1e-6). The rule that is not the run's stays 1e-3 away.
constexpr double kRuleTolerance = 5e-6;

std::string cfg() { return test::env_or("XLOCO_SOURCE_DIR", ".") + "/configs/kjv-tiny.json"; }

std::string outer_small(const std::string& dir, const std::string& name) {
  return " --config " + cfg() + " --set run.dir=" + dir + " --set run.name=" + name +
         " --set model.d_model=32 --set model.n_layer=1 --set model.n_head=2"
         " --set model.seq_len=32 --set inner.batch_size=8 --set inner.warmup_steps=2"
         " --set inner.eval_batches=2 --set inner.log_every=5";
}


// A provider's metrics file in run directory `run` (one JSON record per line).
fs::path provider_metrics(const fs::path& run, const std::string& name) {
  return run / "providers" / name / "metrics" / ("provider-" + name + ".jsonl");
}

std::string provider_hash(const fs::path& run, const std::string& name) {
  for (const auto& r : jsonl(provider_metrics(run, name))) {
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

// The DiLoCo update rule for one provider on fp32 links (θ_pub = θ_true), written from its
// definition. Round r trains H steps from x and measures its progress from `base`: δ = base −
// x_end; the head steps θ ← OuterOpt(θ, δ). Synchronous (fold 0): every round starts from
// θ_pub(r − 1). Delayed (fold k): a round after the first starts where the last one ended, and
// after k steps moves its progress onto θ_pub(r − 1): x ← θ_pub(r − 1) + (x − base), base ←
// θ_pub(r − 1). With outer.keep_local = a, what a round starts from (synchronous) or moves onto
// (delayed) keeps a share of where the last round ended, x_own: θ_pub(r − 1) + a · (x_own −
// θ_pub(r − 1)); delayed, x ← θ_pub(r − 1) + (x − base) + a · (base − θ_pub(r − 1)), base
// being x_own there. Either way δ is measured from θ_pub(r − 1), not from that start. The flat
// θ_true at the end.
// `fold_at[r]`: the step of round r before which round r − 1's update is folded in (H or more:
// after its last step); -1: round r starts from θ_pub (synchronous). Rounds past the vector's
// end take its last entry.
torch::Tensor reference_rule(const common::Config& c, const std::vector<int64_t>& fold_at) {
  inner::Group solo{inner::DistOptions{}};
  inner::InnerTrainer t(c, inner::make_model(c), solo, torch::kCPU);
  t.set_rng_stream(0);  // shard 0's stream, as the provider's
  auto data = inner::make_dataset(c, {0, 1});
  torch::Tensor theta = t.params().detach().clone();  // θ_true = θ_pub
  outer::OuterOptimizer opt(c.outer, theta.numel(), t.layout().buffers_offset);
  const int64_t H = c.outer.inner_steps, rounds = common::total_rounds(c);
  const double a = c.outer.keep_local;
  torch::Tensor base;
  for (int64_t r = 1; r <= rounds; ++r) {
    const torch::Tensor pub = theta.clone();  // θ_pub(r − 1)
    const int64_t fold = fold_at[std::min<size_t>(static_cast<size_t>(r), fold_at.size() - 1)];
    const bool chained = fold >= 0 && r > 1;
    {
      torch::NoGradGuard guard;
      if (!chained && r > 1 && a > 0) {
        t.params().copy_((t.params() - pub).mul_(a).add_(pub));  // x_own is where r − 1 ended
      } else if (!chained) {
        t.params().copy_(pub);
      }
      base = chained ? t.params().clone() : pub.clone();
    }
    auto move_onto_pub = [&] {
      torch::NoGradGuard guard;
      torch::Tensor x = pub + (t.params() - base);
      if (a > 0) x.add_(base, a).sub_(pub, a);
      t.params().copy_(x);
      base = pub.clone();
    };
    const int64_t n = std::min<int64_t>(H, c.inner.steps - (r - 1) * H);
    for (int64_t j = 0; j < n; ++j) {
      if (chained && j == fold) move_onto_pub();
      t.train_step(*data, (r - 1) * H + j);
    }
    if (chained && n <= fold) move_onto_pub();
    torch::NoGradGuard guard;
    const torch::Tensor delta = base - t.params();
    opt.step(theta, delta);
  }
  return theta;
}

// Streaming DiLoCo's rule (arXiv 2501.18512) for one provider on fp32 links, from its
// definition, with the parameters in `parts` (flat ranges [begin, end)): round r syncs part
// p = (r − 1) mod |parts| only. Each part keeps its own base, the θ_pub its progress is measured
// from; a round sends δ_p = base_p − x_p, and the head's Nesterov step (written out here, not
// the OuterOptimizer's) moves θ_p and the momentum's p alone. Synchronous (fold 0): round r
// starts where round r − 1 ended, except that the part round r − 1 synced takes θ_pub(r − 1)
// (base_p ← θ_pub). Delayed (fold k): round r's first k steps run before that part moves its
// progress since round r − 1 ended onto θ_pub: x_p ← θ_pub_p + (x_p − x_end_p), base_p ← θ_pub_p.
// The last round syncs every part: δ = base − x over the whole buffer.
torch::Tensor reference_fragments(const common::Config& c, int64_t fold,
                                  const std::vector<std::pair<int64_t, int64_t>>& parts) {
  inner::Group solo{inner::DistOptions{}};
  inner::InnerTrainer t(c, inner::make_model(c), solo, torch::kCPU);
  t.set_rng_stream(0);
  auto data = inner::make_dataset(c, {0, 1});
  torch::Tensor theta = t.params().detach().clone();
  torch::Tensor mom = torch::zeros_like(theta);
  torch::Tensor base = theta.clone();
  const int64_t H = c.outer.inner_steps, rounds = common::total_rounds(c);
  const auto F = static_cast<int64_t>(parts.size());
  const auto sl = [](torch::Tensor& v, std::pair<int64_t, int64_t> p) { return v.narrow(0, p.first, p.second - p.first); };
  for (int64_t r = 1; r <= rounds; ++r) {
    std::optional<torch::NoGradGuard> guard(std::in_place);  // off for the training steps
    torch::Tensor pub = theta.clone();
    auto prev = parts[static_cast<size_t>((r + F - 2) % F)], cur = parts[static_cast<size_t>((r - 1) % F)];
    if (r == rounds) cur = {0, theta.numel()};
    auto x = t.params();
    const bool chained = fold > 0 && r > 1;
    if (r == 1) {
      x.copy_(pub);
      base.copy_(pub);
    } else if (!chained) {
      sl(x, prev).copy_(sl(pub, prev));
      sl(base, prev).copy_(sl(pub, prev));
    } else {
      sl(base, prev).copy_(sl(x, prev));  // where round r − 1 ended
    }
    auto fold_in = [&] {
      sl(x, prev).sub_(sl(base, prev)).add_(sl(pub, prev));
      sl(base, prev).copy_(sl(pub, prev));
    };
    const int64_t n = std::min<int64_t>(H, c.inner.steps - (r - 1) * H);
    guard.reset();
    for (int64_t j = 0; j < n; ++j) {
      if (chained && j == fold) {
        torch::NoGradGuard g;
        fold_in();
      }
      t.train_step(*data, (r - 1) * H + j);
    }
    guard.emplace();
    if (chained && n <= fold) fold_in();
    const torch::Tensor d = sl(base, cur) - sl(x, cur);
    const double lr = c.outer.lr, mu = c.outer.momentum;
    sl(mom, cur).mul_(mu).add_(d);
    sl(theta, cur).sub_(d, lr).sub_(sl(mom, cur), lr * mu);  // Nesterov, as PyTorch's SGD
  }
  return theta;
}

common::FlatLayout layout_of(const common::Config& c) {
  inner::Group solo{inner::DistOptions{}};
  inner::InnerTrainer t(c, inner::make_model(c), solo, torch::kCPU);
  return t.layout();
}

// The same step in every round: `fold` 0 is the synchronous rule.
torch::Tensor reference_rule(const common::Config& c, int64_t fold) {
  return reference_rule(c, std::vector<int64_t>{fold > 0 ? fold : -1});
}

torch::Tensor flat_theta_pub(const fs::path& ckpt) {
  const auto st = common::read_safetensors((ckpt / "outer.safetensors").string());
  const auto* pub = st.find("theta_pub");
  REQUIRE(pub != nullptr);
  return torch::from_blob(const_cast<uint8_t*>(pub->data.data()),
                          {static_cast<int64_t>(pub->data.size() / 4)}, torch::kFloat32).clone();
}

// `xloco local`, one provider, fp32 links, 5 rounds of 4 steps of a small GPT, synchronous or
// delayed (a fold after 2 steps), with `extra` set too: θ_pub at its end (the same on the head
// and the provider) and the run's config.
std::pair<torch::Tensor, common::Config> one_provider_fp32(const test::ScratchDir& dir,
                                                           const std::string& name, bool delayed,
                                                           const std::string& extra) {
  std::vector<std::string> sets = {
      "run.dir=" + dir.str(), "run.name=" + name, "model.d_model=32", "model.n_layer=1",
      "model.n_head=2", "model.seq_len=32", "inner.batch_size=8", "inner.warmup_steps=2",
      "inner.eval_batches=2", "inner.log_every=5", "inner.steps=20", "inner.lr=4e-4",
      "inner.min_lr=4e-5", "outer.inner_steps=4", "outer.codec_up=fp32", "outer.codec_down=fp32",
      "outer.eval_every=0", extra};
  if (delayed) {
    sets.push_back("outer.overlap=delayed");
    sets.push_back("outer.delay_steps=2");
  }
  std::string args = " --providers 1 --config " + cfg();
  for (const auto& kv : sets) args += " --set " + kv;
  auto l = run_xloco("local" + args);
  INFO(l.out);
  REQUIRE(l.code == 0);
  check_replicas_agree(dir.path / name, 1);
  return {flat_theta_pub(dir.path / name / "ckpt/round-000005"), common::load_config(cfg(), sets)};
}

// A one-layer GPT small enough for a GlobalModel built in a test, fp32 uplink, norm rule off.
common::Config small_head_config() {
  common::Config c = test::tiny_gpt_config();
  c.model.d_model = 32;
  c.model.n_layer = 1;
  c.model.n_head = 2;
  c.model.seq_len = 32;
  c.outer.codec_up = common::CodecKind::kFp32;  // finite values up to FLT_MAX pass the decoder
  c.outer.norm_bound = 0;
  return c;
}

// An fp32 contribution whose every value is `value`, for `model`'s layout.
net::Frame constant_fp32_frame(outer::GlobalModel& model, float value) {
  compress::CodecConfig cc;
  cc.codec = compress::Codec::kFp32;
  cc.error_feedback = false;
  compress::Encoder enc(cc);
  std::vector<uint8_t> out;
  compress::encode(enc, model.layout(), torch::full({model.layout().numel}, value), out);
  return net::Frame(std::move(out));
}

}  // namespace

namespace {

// The relay tests' model: two tensors, one with a short last block.
common::FlatLayout relay_layout() {
  common::FlatLayout layout;
  layout.append("a", {300});
  layout.append("b", {17});
  return layout;
}

// A topk frame (k of every 256, no feedback) of random values drawn from `seed`.
net::Frame relay_frame(const common::FlatLayout& layout, uint32_t topk, uint64_t seed) {
  compress::CodecConfig cc;
  cc.codec = compress::Codec::kTopk;
  cc.block_size = 256;
  cc.topk = topk;
  cc.error_feedback = false;
  torch::manual_seed(seed);
  compress::Encoder enc(cc);
  std::vector<uint8_t> out;
  compress::encode(enc, layout, torch::randn({layout.numel}), out);
  return net::Frame(std::move(out));
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

  TEST_CASE("outer.lr_end: constant lr when unset; linear from outer.lr to lr_end at the last round; checked and hashed only when set") {
    common::OuterConfig c;
    c.lr = 7;
    CHECK(outer::outer_lr(c, 1, 22) == 7.0);  // lr_end < 0: constant
    CHECK(outer::outer_lr(c, 22, 22) == 7.0);
    c.lr_end = 3;
    CHECK(outer::outer_lr(c, 0, 22) == doctest::Approx(7.0));
    CHECK(outer::outer_lr(c, 1, 22) == doctest::Approx(7.0 - 4.0 / 22));
    CHECK(outer::outer_lr(c, 11, 22) == doctest::Approx(5.0));
    CHECK(outer::outer_lr(c, 22, 22) == doctest::Approx(3.0));
    CHECK(outer::outer_lr(c, 30, 22) == doctest::Approx(3.0));  // past the schedule: lr_end
    c.lr_end = 10;  // rising is allowed (a warmup)
    CHECK(outer::outer_lr(c, 11, 22) == doctest::Approx(8.5));

    const std::string before = common::config_hash(common::Config{});
    nlohmann::json j = common::to_json(common::Config{});
    j["outer"]["lr_end"] = -1;  // unset: runs from before it hash as before
    CHECK(common::config_hash(common::parse_config(j)) == before);
    j["outer"]["lr_end"] = 0.5;  // it changes θ: hashed
    CHECK(common::config_hash(common::parse_config(j)) != before);
    j["outer"]["lr_end"] = 200;
    CHECK_THROWS_WITH_AS(common::parse_config(j), doctest::Contains("outer.lr_end"), common::ConfigError);
    j["outer"]["lr_end"] = "low";
    CHECK_THROWS_WITH_AS(common::parse_config(j), doctest::Contains("outer.lr_end"), common::ConfigError);
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
      XLOCO_SKIP_CASE("/usr/bin/bible missing (Debian package bible-kjv)");
    }
    const common::Config c = small_head_config();  // fp32 up, the norm rule off: this guard alone
    outer::GlobalModel model(c, "");
    const std::string before = model.pub_hash();
    model.aggregator().begin({"rogue"});
    CHECK(model.aggregator().add("rogue", constant_fp32_frame(model, std::numeric_limits<float>::max()), 100).empty());
    const auto closed = model.close_round();
    REQUIRE(closed.discarded);
    CHECK(closed.discarded->find("non-finite") != std::string::npos);
    CHECK(closed.discarded->find("transformer.wte.weight[0]") != std::string::npos);
    model.rehash();
    CHECK(model.pub_hash() == before);  // θ_pub (and θ_true under it) unchanged
    // The next, sound round steps as usual.
    model.aggregator().begin({"p0"});
    CHECK(model.aggregator().add("p0", constant_fp32_frame(model, 1e-3f), 100).empty());
    CHECK(!model.close_round().discarded);
    model.rehash();
    CHECK(model.pub_hash() != before);
  }

  TEST_CASE("outer.lr_end: the head steps each round at that round's lr (lr 1 falling to 0 over 2 rounds: half a step, then none)") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing (Debian package bible-kjv)");
    }
    common::Config c = small_head_config();
    c.outer.codec_down = common::CodecKind::kFp32;  // θ_pub == θ_true
    c.outer.momentum = 0;
    c.outer.lr = 1;
    c.outer.lr_end = 0;
    c.inner.steps = 2 * c.outer.inner_steps;  // 2 rounds: lr 0.5, then 0
    REQUIRE(common::total_rounds(c) == 2);
    outer::GlobalModel model(c, "");
    const int64_t n = model.layout().trained_numel();
    const auto theta0 = model.theta_pub().narrow(0, 0, n).clone();
    model.aggregator().begin({"p0"});
    CHECK(model.aggregator().add("p0", constant_fp32_frame(model, 0.25f), 100).empty());
    CHECK(!model.close_round().discarded);
    CHECK(torch::allclose(model.theta_pub().narrow(0, 0, n), theta0 - 0.125, 1e-6, 1e-6));
    const auto theta1 = model.theta_pub().narrow(0, 0, n).clone();
    model.aggregator().begin({"p0"});
    CHECK(model.aggregator().add("p0", constant_fp32_frame(model, 0.25f), 100).empty());
    CHECK(!model.close_round().discarded);
    CHECK(torch::equal(model.theta_pub().narrow(0, 0, n), theta1));  // the last round: lr 0
  }

  TEST_CASE("K=1, H=1, outer lr 1, momentum 0, fp32 both ways == xloco train (1e-6)") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
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

  TEST_CASE("outer.overlap = delayed, one provider, fp32 links: theta is the delayed rule's, not the synchronous one's") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
    }
    test::ScratchDir dir("delayed");
    const std::vector<std::string> sets = {
        "run.dir=" + dir.str(), "run.name=delayed", "model.d_model=32", "model.n_layer=1",
        "model.n_head=2", "model.seq_len=32", "inner.batch_size=8", "inner.warmup_steps=2",
        "inner.eval_batches=2", "inner.log_every=5", "inner.steps=20", "inner.lr=4e-4",
        "inner.min_lr=4e-5", "outer.inner_steps=4", "outer.codec_up=fp32", "outer.codec_down=fp32",
        "outer.eval_every=0", "outer.overlap=delayed", "outer.delay_steps=2"};
    std::string args = " --providers 1 --config " + cfg();
    for (const auto& kv : sets) args += " --set " + kv;
    auto l = run_xloco("local" + args);
    INFO(l.out);
    REQUIRE(l.code == 0);
    check_replicas_agree(dir.path / "delayed", 1);
    const torch::Tensor got = flat_theta_pub(dir.path / "delayed/ckpt/round-000005");
    const auto c = common::load_config(cfg(), sets);
    const torch::Tensor delayed = reference_rule(c, 2), sync = reference_rule(c, 0),
                        at_end = reference_rule(c, 4);
    REQUIRE(got.numel() == delayed.numel());
    const double to_delayed = (got - delayed).abs().max().item<double>();
    const double to_sync = (got - sync).abs().max().item<double>();
    const double to_end = (got - at_end).abs().max().item<double>();
    MESSAGE("max |run - delayed rule| = " << to_delayed << "; to the synchronous rule " << to_sync
            << "; to the rule folding at the round's end " << to_end);
    CHECK(to_delayed <= 1e-6);
    // The rules are told apart: the test fails if the run follows another one.
    CHECK(to_sync > 100 * std::max(to_delayed, 1e-7));
    CHECK(to_end > 100 * std::max(to_delayed, 1e-7));
    // Every round after the first was trained before the head started it.
    CHECK(test::chained_rounds(provider_metrics(dir.path / "delayed", "provider-0")) == 4);
  }

  TEST_CASE("outer.keep_local: synchronous and delayed, theta follows the rule that keeps a share of the provider's own parameters") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
    }
    test::ScratchDir dir("keep_local");
    for (const bool delayed : {false, true}) {
      const std::string name = delayed ? "delayed" : "sync";
      auto [got, c] = one_provider_fp32(dir, name, delayed, "outer.keep_local=0.5");
      const int64_t fold = delayed ? 2 : 0;
      const torch::Tensor rule = reference_rule(c, fold);
      c.outer.keep_local = 0;
      const torch::Tensor plain = reference_rule(c, fold);
      const double to_rule = (got - rule).abs().max().item<double>();
      const double to_plain = (got - plain).abs().max().item<double>();
      MESSAGE(name << ": max |run - rule with keep_local 0.5| = " << to_rule << "; to the rule without it " << to_plain);
      CHECK(to_rule <= kRuleTolerance);
      CHECK(to_plain > 100 * std::max(to_rule, 1e-7));
    }
  }

  TEST_CASE("outer.fragments: tensors in contiguous groups of about equal size, each once; more groups than tensors refused") {
    common::Config c = test::tiny_gpt_config();
    const auto layout = layout_of(c);
    const int64_t largest = std::max_element(layout.slots.begin(), layout.slots.end(), [](const auto& a, const auto& b) { return a.numel < b.numel; })->numel;
    for (const int F : {1, 2, 3, 5, static_cast<int>(layout.slots.size())}) {
      CAPTURE(F);
      auto parts = outer::split_fragments(layout, F);
      // F groups, and after them (F > 1) the whole layout, for the last round.
      REQUIRE(parts.size() == static_cast<size_t>(F) + (F > 1 ? 1 : 0));
      if (F > 1) {
        CHECK(parts.back().begin == 0);
        CHECK(parts.back().end == layout.numel);
        CHECK(parts.back().layout.slots.size() == layout.slots.size());
        parts.pop_back();
      }
      size_t slot = 0;
      int64_t at = 0;
      for (const auto& p : parts) {
        REQUIRE(!p.layout.slots.empty());
        CHECK(p.begin == at);
        CHECK(p.layout.numel == layout.numel);  // cuts the whole buffer
        for (const auto& s : p.layout.slots) {
          REQUIRE(slot < layout.slots.size());
          CHECK(s.name == layout.slots[slot].name);
          CHECK(s.offset == at);
          at += s.numel;
          ++slot;
        }
        CHECK(p.end == at);
        // About 1/F of the elements: off by at most the largest tensor.
        CHECK(std::abs(static_cast<double>(p.numel()) - static_cast<double>(layout.numel) / F) <= static_cast<double>(largest));
      }
      CHECK(slot == layout.slots.size());
      CHECK(at == layout.numel);
    }
    CHECK(outer::fragment_index(1, 3, 8) == 0);
    CHECK(outer::fragment_index(3, 3, 8) == 2);
    CHECK(outer::fragment_index(4, 3, 8) == 0);
    CHECK(outer::fragment_index(8, 3, 8) == 3);  // the last round: the whole layout
    CHECK(outer::fragment_index(8, 1, 8) == 0);
    try {
      outer::split_fragments(layout, static_cast<int>(layout.slots.size()) + 1);
      FAIL("more groups than tensors accepted");
    } catch (const common::ConfigError& e) {
      CHECK(std::string(e.what()).find("outer.fragments") != std::string::npos);
    }
    // Fragments go with a time budget; they are hashed only when set.
    CHECK(common::load_config(cfg(), {"outer.fragments=2", "outer.round_budget_s=5"}).outer.fragments == 2);
    const auto plain = common::load_config(cfg(), {}), two = common::load_config(cfg(), {"outer.fragments=2"}),
               one = common::load_config(cfg(), {"outer.fragments=1"});
    CHECK(common::config_hash(one) == common::config_hash(plain));
    CHECK(common::config_hash(two) != common::config_hash(plain));
  }

  TEST_CASE("outer.fragments: a contribution is judged against its fragment's tensors, and its norm against that fragment's last round but not its first sync") {
    common::Config c = test::tiny_gpt_config();
    c.outer.codec_up = common::CodecKind::kFp32;
    const auto layout = layout_of(c);
    const auto parts = outer::split_fragments(layout, 2);
    const auto frame = [&](const outer::Fragment& part, float value) {
      compress::CodecConfig cc;
      cc.codec = compress::Codec::kFp32;
      cc.error_feedback = false;
      compress::Encoder enc(cc);
      std::vector<uint8_t> out;
      compress::encode(enc, part.layout, torch::full({layout.numel}, value), out);
      return net::Frame(std::move(out));
    };
    CHECK(!outer::frame_problem(frame(parts[0], 1), parts[0].layout, c.outer));
    CHECK(outer::frame_problem(frame(parts[1], 1), parts[0].layout, c.outer));
    CHECK(outer::frame_problem(frame(parts[0], 1), layout, c.outer));
    // Round 1 syncs fragment 0 with small values, round 2 fragment 1 with values 100x larger.
    // Judged against fragment 0's norms they would be refused (norm_bound 10); they are not.
    // A round of fragment i in which "a" and "b" both send `value` everywhere: both accepted.
    const auto both_accepted = [&](outer::Aggregator& a, size_t i, float value, bool reference) {
      a.begin({"a", "b"}, 0, &parts[i].layout, i, reference);
      CHECK(a.add("a", frame(parts[i], value), 100).empty());
      CHECK(a.add("b", frame(parts[i], value), 100).empty());
      CHECK(a.finish().empty());
      CHECK(a.added() == 2);
    };
    outer::Aggregator agg(layout, 10);
    both_accepted(agg, 0, 0.01f, true);
    // Only fragment 0's tensors hold Δ.
    CHECK(agg.delta().narrow(0, parts[0].begin, parts[0].numel()).eq(0.01f).all().item<bool>());
    both_accepted(agg, 1, 1.0f, true);
    CHECK(agg.delta().narrow(0, parts[1].begin, parts[1].numel()).eq(1.0f).all().item<bool>());
    // Back at fragment 0, a value 100x its last round's is an outlier there.
    agg.begin({"a", "b"}, 0, &parts[0].layout, 0);
    const auto refused = agg.add("a", frame(parts[0], 1.0f), 100);
    REQUIRE(refused.size() == 1);
    CHECK(refused[0].code == net::RefusalCode::kOutlier);
    CHECK(agg.add("b", frame(parts[0], 0.01f), 100).empty());
    CHECK(agg.finish().empty());
    // A round whose norms are no reference (a fragment's first sync, which covers fewer steps)
    // is not kept: the next round of fragment 1, 100x larger, is judged by its peers alone.
    outer::Aggregator first(layout, 10);
    both_accepted(first, 1, 0.01f, /*reference=*/false);
    both_accepted(first, 1, 1.0f, true);
  }

  TEST_CASE("outer.fragments = 2, one provider, fp32 links: theta follows Streaming DiLoCo's rule, synchronous and delayed") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
    }
    test::ScratchDir dir("fragments");
    for (const bool delayed : {false, true}) {
      const std::string name = delayed ? "delayed" : "sync";
      const auto [got, c] = one_provider_fp32(dir, name, delayed, "outer.fragments=2");
      const auto split = outer::split_fragments(layout_of(c), 2);
      const int64_t fold = delayed ? 2 : 0;
      const torch::Tensor rule = reference_fragments(c, fold, {{split[0].begin, split[0].end}, {split[1].begin, split[1].end}});
      // The same rule with one part is DiLoCo's (the fragments told apart from no fragments).
      const torch::Tensor whole = reference_fragments(c, fold, {{0, got.numel()}});
      REQUIRE(got.numel() == rule.numel());
      const double to_rule = (got - rule).abs().max().item<double>();
      const double to_whole = (got - whole).abs().max().item<double>();
      MESSAGE(name << ": max |run - Streaming DiLoCo rule, 2 fragments| = " << to_rule << "; to the rule with one " << to_whole);
      CHECK(to_rule <= kRuleTolerance);
      CHECK(to_whole > 100 * std::max(to_rule, 1e-7));
      // A round's frames carry half the model: its uplink bytes are about half of fp32's.
      for (const auto& rec : jsonl(provider_metrics(dir.path / name, "provider-0"))) {
        if (!rec.contains("round_done")) continue;
        const double up = rec["up_bytes"].get<double>();
        const auto part = split[outer::fragment_index(rec["round_done"].get<uint64_t>(), 2, 5)];
        CHECK(up < static_cast<double>(part.numel()) * 4 + 4096);
        CHECK(up > static_cast<double>(part.numel()) * 2);  // zstd takes a little off fp32 at most
      }
    }
  }

  TEST_CASE("outer.round_budget_s with 2 fragments, delayed, provider-1 4x slower: it runs fewer steps, the head counts both's tokens, theta_pub agrees") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
    }
    test::ScratchDir dir("budget-fragments");
    // H = 400 is only the cap: the budget of 0.3 s ends every round well before it.
    setenv("XLOCO_THROTTLE", "provider-1=4", 1);
    auto l = run_xloco("local --providers 2" + outer_small(dir.str(), "b") +
                       " --set inner.steps=2000 --set outer.inner_steps=400 --set outer.eval_every=0"
                       " --set outer.round_budget_s=0.3 --set outer.min_inner_steps=2"
                       " --set outer.fragments=2 --set outer.overlap=delayed --set outer.fold=arrival"
                       " --set outer.delay_steps=400");
    unsetenv("XLOCO_THROTTLE");
    INFO(l.out);
    REQUIRE(l.code == 0);
    const fs::path run = dir.path / "b";
    check_replicas_agree(run, 2);
    // Per round and provider: steps and tokens from the providers' metrics.
    std::map<uint64_t, uint64_t> tokens;
    std::map<std::string, int64_t> steps;
    size_t chained = 0;
    for (const std::string name : {"provider-0", "provider-1"}) {
      for (const auto& m : jsonl(provider_metrics(run, name))) {
        if (!m.contains("round_done")) continue;
        tokens[m["round_done"].get<uint64_t>()] += m["tokens"].get<uint64_t>();
        steps[name] += m["steps"].get<int64_t>();
        chained += m["chained"].get<bool>() ? 1 : 0;
        CHECK(m["steps"].get<int64_t>() >= 2);                        // min_inner_steps
        CHECK(std::abs(m["budget_carry_s"].get<double>()) <= 0.15 + 1e-9);  // within ± budget / 2
      }
    }
    MESSAGE("steps: provider-0 " << steps["provider-0"] << ", provider-1 (4x slower) " << steps["provider-1"]);
    CHECK(chained >= 6);  // rounds 2..5 of both, but for a resync
    CHECK(steps["provider-1"] * 2 < steps["provider-0"]);  // the slow one ran fewer, no one waited for H
    // The head's rounds count the tokens each provider trained, whatever their number.
    const auto rounds = jsonl(run / "metrics/head.jsonl");
    REQUIRE(rounds.size() == 5);
    for (const auto& r : rounds) {
      CAPTURE(r.dump());
      CHECK(r["participants"].get<int>() == 2);
      CHECK(r["tokens"].get<uint64_t>() == tokens[r["round"].get<uint64_t>()]);
    }
  }

  TEST_CASE("outer.fold = arrival: each round folds as soon as the update is in, and theta follows the rule at those steps") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
    }
    test::ScratchDir dir("arrival");
    // H = delay_steps = 16: a fold at step 16 would be the fallback (the update never seen
    // early). The throttle makes a step ~30x slower, so that the update (tens of ms on
    // loopback) comes in a few steps into the next round.
    const std::vector<std::string> sets = {
        "run.dir=" + dir.str(), "run.name=arrival", "model.d_model=32", "model.n_layer=1",
        "model.n_head=2", "model.seq_len=32", "inner.batch_size=8", "inner.warmup_steps=2",
        "inner.eval_batches=2", "inner.log_every=8", "inner.steps=64", "inner.lr=4e-4",
        "inner.min_lr=4e-5", "outer.inner_steps=16", "outer.codec_up=fp32", "outer.codec_down=fp32",
        "outer.eval_every=0", "outer.overlap=delayed", "outer.delay_steps=16", "outer.fold=arrival"};
    std::string args = " --providers 1 --config " + cfg();
    for (const auto& kv : sets) args += " --set " + kv;
    setenv("XLOCO_THROTTLE", "provider-0=30", 1);
    auto l = run_xloco("local" + args);
    unsetenv("XLOCO_THROTTLE");
    INFO(l.out);
    REQUIRE(l.code == 0);
    check_replicas_agree(dir.path / "arrival", 1);
    std::vector<int64_t> fold_at = {-1, -1};  // round 1 is not chained
    for (const auto& m : jsonl(provider_metrics(dir.path / "arrival", "provider-0"))) {
      if (!m.contains("round_done") || m["round_done"].get<int64_t>() < 2) continue;
      REQUIRE(m["chained"].get<bool>());
      fold_at.push_back(m["folded_at"].get<int64_t>());
    }
    REQUIRE(fold_at.size() == 5);  // rounds 2..4
    std::string folds;
    for (size_t r = 2; r < fold_at.size(); ++r) folds += " " + std::to_string(fold_at[r]);
    MESSAGE("folded before steps" << folds << " of rounds 2..4 (16: the fallback)");
    // The update of a round comes in well before the next one's 16 steps are done.
    CHECK(*std::max_element(fold_at.begin() + 2, fold_at.end()) < 16);
    const auto c = common::load_config(cfg(), sets);
    const torch::Tensor got = flat_theta_pub(dir.path / "arrival/ckpt/round-000004");
    const double to_rule = (got - reference_rule(c, fold_at)).abs().max().item<double>();
    const double to_fallback = (got - reference_rule(c, 16)).abs().max().item<double>();
    MESSAGE("max |run - rule at those steps| = " << to_rule << "; to the rule folding at step 16 " << to_fallback);
    CHECK(to_rule <= kRuleTolerance);
    CHECK(to_fallback > 100 * std::max(to_rule, 1e-7));
  }

  TEST_CASE("fp32 both ways: theta_pub == theta_true bit for bit; identical data gives identical pseudo-gradients") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
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
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
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
    // Both joined at the run's start with the θ₀ they built from the seed: no state was sent.
    const auto count = [](const std::string& text, const std::string& what) {
      size_t n = 0;
      for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
      return n;
    };
    CHECK(count(l.out, "joined at round 0 (already current)") == 2);
    CHECK(count(l.out, "no state to download") == 2);
    CHECK(count(l.out, "(full state)") == 0);

    // A warm start from that run's last checkpoint: `xloco local --init` gives the weights to
    // the workers too (`xloco worker --init`), so they join with the head's θ and none is sent.
    // A worker that ignored them would build θ₀ from the seed and be sent the full state.
    std::vector<fs::path> ckpts;
    for (const auto& e : fs::directory_iterator(dir.path / "q/ckpt")) ckpts.push_back(e.path());
    REQUIRE(!ckpts.empty());
    std::sort(ckpts.begin(), ckpts.end());
    auto w = run_xloco("local --providers 2 --init " + ckpts.back().string() +
                       outer_small(dir.str(), "w") + " --set inner.steps=5 --set outer.inner_steps=5");
    INFO(w.out);
    REQUIRE(w.code == 0);
    CHECK(w.out.find("warm start from") != std::string::npos);
    CHECK(count(w.out, "(the head's warm start)") == 2);
    CHECK(count(w.out, "joined at round 0 (already current)") == 2);
    CHECK(count(w.out, "no state to download") == 2);
    CHECK(count(w.out, "(full state)") == 0);
    check_replicas_agree(dir.path / "w", 2);
  }

  TEST_CASE("topk, 4-bit values up and 2-bit down: every round accepted, theta_pub bit-identical on the head and every provider") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
    }
    test::ScratchDir dir("topk4");
    auto l = run_xloco("local --providers 2" + outer_small(dir.str(), "t") +
                       " --set inner.steps=15 --set outer.inner_steps=5 --set outer.codec_up=topk"
                       " --set outer.codec_down=topk --set outer.topk=8 --set outer.topk_down=16"
                       " --set outer.topk_bits=4 --set outer.topk_bits_down=2 --set outer.momentum=0");
    INFO(l.out);
    REQUIRE(l.code == 0);
    check_replicas_agree(dir.path / "t", 2);
    CHECK(l.out.find("refused") == std::string::npos);
    const auto summary = outer::read_document<outer::RunSummary>((dir.path / "t/summary.json").string());
    CHECK(summary.rounds == 3);
    CHECK(summary.bytes_vs_fp32_dp < 0.02);  // int8 is about 0.06 here
  }

  TEST_CASE("reproducible: two xloco local runs with the providers started in different orders end with the same theta_pub and eval loss") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
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

  TEST_CASE("relay: an update is written and read back, its frames shared and the receiver's own left out; hostile updates are refused by name") {
    const common::FlatLayout layout = relay_layout();
    const auto frame_of = [&](uint64_t seed) { return relay_frame(layout, 8, seed); };
    outer::RelayBundle b{0.5f, 3.0, {{"p0", 1.0, frame_of(1), false}, {"p1", 2.0, frame_of(2), false}},
                         {common::RelayMean::kClipped, 3.0, {0.5, 1e-3}}};
    const net::Update all = outer::write_relay(b);
    CHECK(outer::is_relay_update(all));
    REQUIRE(all.parts.size() == 2);
    for (size_t i = 0; i < 2; ++i) CHECK(all.parts[i].data() == b.parts[i].frame.data());  // not copied
    const auto back = outer::read_relay(all);
    CHECK(back.lr == 0.5f);
    CHECK(back.weight_sum == 3.0);
    CHECK(back.rule.mean == common::RelayMean::kClipped);  // the update rule travels with it
    CHECK(back.rule.clip == 3.0);
    CHECK(back.rule.trust.tau == 0.5);
    CHECK(back.rule.trust.floor == 1e-3);
    REQUIRE(back.parts.size() == 2);
    for (size_t i = 0; i < 2; ++i) {
      CHECK(back.parts[i].peer == b.parts[i].peer);
      CHECK(back.parts[i].weight == b.parts[i].weight);
      CHECK(back.parts[i].frame.data() == b.parts[i].frame.data());
      CHECK_FALSE(back.parts[i].own);
    }
    const net::Update for_p1 = outer::write_relay(b, "p1");
    REQUIRE(for_p1.parts.size() == 1);
    CHECK(for_p1.parts[0].data() == b.parts[0].frame.data());
    CHECK(for_p1.payload.size() == all.payload.size());
    const auto mine = outer::read_relay(for_p1);
    CHECK_FALSE(mine.parts[0].own);
    CHECK(mine.parts[1].own);
    CHECK(mine.parts[1].frame.empty());
    CHECK(outer::write_relay(b, "p9").parts.size() == 2);  // not in it: every frame
    // Through the protocol: the frames are the message's own parts, and come back as such.
    const net::Message wire = net::encode({"r", 3, all});
    REQUIRE(wire.size() == 4);
    const auto decoded = std::get<net::Update>(net::decode(wire, "r").body);
    CHECK(outer::read_relay(decoded).parts[1].frame == b.parts[1].frame);

    const auto kind = [&](std::vector<uint8_t> header, std::vector<net::Frame> frames)
        -> std::optional<compress::FrameErrorKind> {
      try {
        outer::read_relay(net::Update{net::Frame(std::move(header)), std::move(frames)});
      } catch (const compress::FrameError& e) {
        return e.kind();
      }
      return std::nullopt;
    };
    const auto good = all.payload.to_vector();
    const auto frames = all.parts;
    REQUIRE(kind(good, frames) == std::nullopt);
    for (size_t n = 0; n < good.size(); n += 7) {  // cut anywhere: refused
      CAPTURE(n);
      CHECK(kind(std::vector<uint8_t>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n)), frames).has_value());
    }
    constexpr size_t kPart0 = 49;  // where the first part starts (relay.h)
    auto f = good;
    f[0] = 'Y';
    CHECK(kind(f, frames) == compress::FrameErrorKind::kBadMagic);
    f = good;
    f[4] = 2;  // version 2 (frames inside the bundle): refused, not misread
    CHECK(kind(f, frames) == compress::FrameErrorKind::kBadVersion);
    f = good;
    const uint32_t many = outer::kMaxRelayParts + 1;
    std::memcpy(f.data() + 8, &many, 4);
    CHECK(kind(f, frames) == compress::FrameErrorKind::kOverLimit);
    f = good;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(f.data() + 12, &nan, 4);  // the outer rate
    CHECK(kind(f, frames) == compress::FrameErrorKind::kCorrupt);
    f = good;
    f[24] = 3;  // a relay mean that is none of the three
    CHECK(kind(f, frames) == compress::FrameErrorKind::kCorrupt);
    for (const size_t at : {25, 33, 41}) {  // relay clip, trust region, trust floor: finite, ≥ 0
      CAPTURE(at);
      f = good;
      const double bad = at == 33 ? -1.0 : std::numeric_limits<double>::infinity();
      std::memcpy(f.data() + at, &bad, 8);
      CHECK(kind(f, frames) == compress::FrameErrorKind::kCorrupt);
    }
    f = good;
    const double zero = 0;
    std::memcpy(f.data() + kPart0 + 2 + 2, &zero, 8);  // p0's weight (after name_len and "p0")
    CHECK(kind(f, frames) == compress::FrameErrorKind::kCorrupt);
    f = good;
    f[kPart0 + 2 + 2 + 8 + 4] = 1;  // p0 flagged as left out, yet its size is declared
    CHECK(kind(f, frames) == compress::FrameErrorKind::kCorrupt);
    for (const float clip : {0.0f, -1.0f, 1.5f, nan}) {  // p0's clip factor: (0, 1] only
      CAPTURE(clip);
      f = good;
      std::memcpy(f.data() + kPart0 + 2 + 2 + 8, &clip, 4);
      CHECK(kind(f, frames) == compress::FrameErrorKind::kCorrupt);
    }
    f = good;
    f.push_back(0);
    CHECK(kind(f, frames) == compress::FrameErrorKind::kCorrupt);
    // The frames after the header: one missing, one too many, one of another size.
    CHECK(kind(good, {frames[0]}) == compress::FrameErrorKind::kTruncated);
    CHECK(kind(good, {frames[0], frames[1], frames[1]}) == compress::FrameErrorKind::kCorrupt);
    CHECK(kind(good, {frames[0], net::Frame::copy_of(frames[1].data(), frames[1].size() - 1)}) ==
          compress::FrameErrorKind::kCorrupt);
    // A provider named twice (so a receiver could be told to fill in its own frame twice).
    auto twice = b;
    twice.parts[1].peer = "p0";
    CHECK(kind(outer::write_relay(twice).payload.to_vector(), frames) ==
          compress::FrameErrorKind::kCorrupt);
  }

  TEST_CASE("relay: a part's clip factor travels in the bundle and scales its values on every replica alike; the trust region scales a tensor's step onto its radius") {
    const common::FlatLayout layout = relay_layout();
    compress::Decoder dec;
    const net::Frame f0 = relay_frame(layout, 16, 11), f1 = relay_frame(layout, 16, 12);
    auto v0 = torch::zeros({layout.numel}), v1 = torch::zeros({layout.numel});
    compress::decode(dec, f0.data(), f0.size(), layout, v0);
    compress::decode(dec, f1.data(), f1.size(), layout, v1);
    outer::RelayBundle b{1.0f, 2.0, {{"p0", 1.0, f0, false, 1.0f}, {"p1", 1.0, f1, false, 0.25f}}, {}};
    const auto back = outer::read_relay(outer::write_relay(b));
    REQUIRE(back.parts.size() == 2);
    CHECK(back.parts[0].clip == 1.0f);
    CHECK(back.parts[1].clip == 0.25f);
    torch::manual_seed(3);
    const auto theta0 = torch::randn({layout.numel});
    for (const auto mean : {common::RelayMean::kAll, common::RelayMean::kPresent, common::RelayMean::kClipped}) {
      CAPTURE(static_cast<int>(mean));
      auto head = theta0.clone(), replica = theta0.clone(), unclipped = theta0.clone();
      outer::RelayBuffers b1, b2, b3;
      CHECK_FALSE(outer::apply_relay(dec, b, head, layout, mean, 2.0, b1).has_value());
      CHECK_FALSE(outer::apply_relay(dec, back, replica, layout, mean, 2.0, b2).has_value());
      CHECK(torch::equal(head, replica));  // bit for bit
      auto plain = b;
      plain.parts[1].clip = 1.0f;
      CHECK_FALSE(outer::apply_relay(dec, plain, unclipped, layout, mean, 2.0, b3).has_value());
      CHECK_FALSE(torch::equal(head, unclipped));  // the factor was applied
    }
    // "all": θ − lr·(deq0 + 0.25·deq1)/2, elementwise.
    auto all = theta0.clone();
    outer::RelayBuffers ba;
    CHECK_FALSE(outer::apply_relay(dec, b, all, layout, common::RelayMean::kAll, 2.0, ba).has_value());
    CHECK(torch::allclose(all, theta0 - (v0 + 0.25 * v1) / 2, 1e-5, 1e-6));
    // The trust region: a radius of 1 % of ‖θₜ‖ (no floor) scales both tensors' steps onto it.
    auto bounded = theta0.clone();
    outer::RelayBuffers bt;
    CHECK_FALSE(outer::apply_relay(dec, b, bounded, layout, common::RelayMean::kAll, 2.0, bt,
                                   outer::TrustRegion{0.01, 0}).has_value());
    CHECK(bt.trust_scaled == 2);
    CHECK(bt.trust_ratio > 1);
    for (const auto& s : layout.slots) {
      const auto step = (bounded - theta0).narrow(0, s.offset, s.numel).norm().item<double>();
      const auto radius = 0.01 * theta0.narrow(0, s.offset, s.numel).norm().item<double>();
      CHECK(step == doctest::Approx(radius).epsilon(1e-3));
    }
    auto wide = theta0.clone();
    outer::RelayBuffers bw;
    CHECK_FALSE(outer::apply_relay(dec, b, wide, layout, common::RelayMean::kAll, 2.0, bw,
                                   outer::TrustRegion{100, 0}).has_value());
    CHECK(bw.trust_scaled == 0);
    CHECK(torch::equal(wide, all));  // within the region: the same bits as without one
  }

  TEST_CASE("relay: the part worked through in spans of any size gives the bits of one span; a non-finite result in a later span leaves every span as it was") {
    common::FlatLayout layout;  // four tensors: spans of one, two or all of them
    layout.append("a", {300});
    layout.append("b", {17});
    layout.append("c", {64, 4});
    layout.append("d", {40});
    compress::Decoder dec;
    const outer::RelayBundle b{0.75f, 4.5, {{"p0", 1.0, relay_frame(layout, 16, 21), false, 1.0f},
                                           {"p1", 2.0, relay_frame(layout, 16, 22), false, 0.5f},
                                           {"p2", 1.5, relay_frame(layout, 16, 23), false, 1.0f}}, {}};
    torch::manual_seed(4);
    const auto theta0 = torch::randn({layout.numel});
    for (const auto mean : {common::RelayMean::kAll, common::RelayMean::kPresent, common::RelayMean::kClipped}) {
      for (const double tau : {0.0, 0.01}) {
        CAPTURE(static_cast<int>(mean));
        CAPTURE(tau);
        auto whole = theta0.clone();
        outer::RelayBuffers one;
        CHECK_FALSE(outer::apply_relay(dec, b, whole, layout, mean, 2.0, one, {tau, 0}).has_value());
        CHECK_FALSE(one.two_pass);
        CHECK(one.acc.numel() == layout.numel);  // one span
        CHECK_FALSE(torch::equal(whole, theta0));
        for (const int64_t chunk : {1, 300, 320, 600}) {
          CAPTURE(chunk);
          auto spans = theta0.clone();
          outer::RelayBuffers buf;
          buf.chunk = chunk;
          CHECK_FALSE(outer::apply_relay(dec, b, spans, layout, mean, 2.0, buf, {tau, 0}).has_value());
          CHECK(buf.acc.numel() <= std::max<int64_t>(chunk, 300));  // the widest span, no more
          CHECK(buf.acc.numel() < layout.numel);
          CHECK(torch::equal(spans, whole));  // bit for bit
          CHECK(buf.trust_scaled == one.trust_scaled);
          CHECK(buf.trust_ratio == one.trust_ratio);
        }
      }
    }
    // θ holds ±FLT_MAX in its last tensor and the weights sum to 1e-36: the first three
    // tensors' steps are finite, the last one's are not. Dry run first; θ as it was.
    auto tiny = b;
    tiny.weight_sum = 1e-36;
    auto edge = theta0.clone();
    edge.narrow(0, layout.slots[3].offset, 20).fill_(std::numeric_limits<float>::max());
    edge.narrow(0, layout.slots[3].offset + 20, 20).fill_(-std::numeric_limits<float>::max());
    const auto edge0 = edge.clone();
    outer::RelayBuffers buf;
    buf.chunk = 1;
    const auto at = outer::apply_relay(dec, tiny, edge, layout, common::RelayMean::kAll, 2.0, buf);
    REQUIRE(at.has_value());
    CHECK(*at >= layout.slots[3].offset);  // found in the last span
    CHECK(buf.two_pass);
    CHECK(torch::equal(edge, edge0));
    // Two fp32 frames that both send 3e38 at one element of the last tensor, and a weight sum
    // of 1e20: the mean would be small, but the sum on the way to it overflows. Their other
    // values (about 1e28) would move every earlier span by about 1e8: none is stepped.
    compress::CodecConfig fp32;
    fp32.codec = compress::Codec::kFp32;
    const auto big_frame = [&](uint64_t seed) {
      torch::manual_seed(seed);
      auto v = torch::randn({layout.numel}) * 1e28;
      v[layout.slots[3].offset + 5] = 3e38f;
      compress::Encoder enc(fp32);
      std::vector<uint8_t> out;
      compress::encode(enc, layout, v, out);
      return net::Frame(std::move(out));
    };
    const outer::RelayBundle big{0.5f, 1e20, {{"p0", 1.0, big_frame(31), false, 1.0f},
                                              {"p1", 1.0, big_frame(32), false, 1.0f}}, {}};
    for (const auto mean : {common::RelayMean::kAll, common::RelayMean::kPresent, common::RelayMean::kClipped}) {
      CAPTURE(static_cast<int>(mean));
      auto kept = theta0.clone();
      outer::RelayBuffers bb;
      bb.chunk = 1;
      const auto where = outer::apply_relay(dec, big, kept, layout, mean, 2.0, bb);
      REQUIRE(where.has_value());
      CHECK(*where == layout.slots[3].offset + 5);
      CHECK(bb.two_pass);
      CHECK(torch::equal(kept, theta0));
    }
  }

  TEST_CASE("relay: theta - lr * sum(w * deq(frame)) / sum(w), identical bits on every replica; a non-finite step leaves theta as it was") {
    const common::FlatLayout layout = relay_layout();
    compress::Decoder dec;
    std::vector<net::Frame> frames;
    std::vector<torch::Tensor> values;  // what each frame decodes to
    for (uint64_t seed : {5, 6, 7}) {
      frames.push_back(relay_frame(layout, 16, seed));
      auto v = torch::zeros({layout.numel});
      compress::decode(dec, frames.back().data(), frames.back().size(), layout, v);
      values.push_back(v);
    }
    const outer::RelayBundle b{0.75f, 4.0, {{"p0", 1.0, frames[0], false},
                                           {"p1", 2.0, frames[1], false},
                                           {"p2", 1.0, frames[2], false}}, {}};
    torch::manual_seed(9);
    const auto theta0 = torch::randn({layout.numel});
    auto theta = theta0.clone();
    outer::RelayBuffers buf;
    CHECK_FALSE(outer::apply_relay(dec, b, theta, layout, common::RelayMean::kAll, 2.0, buf).has_value());
    const float* t0 = theta0.data_ptr<float>();
    const std::array<std::pair<const float*, float>, 3> parts{
        {{values[0].data_ptr<float>(), 1.0f}, {values[1].data_ptr<float>(), 2.0f},
         {values[2].data_ptr<float>(), 1.0f}}};
    // The rule by hand, one float operation at a time: Σ wₖ·xₖ in part order, divided by every
    // part's weight (4) or, "present", by the weight of the parts nonzero there; lr · d is one
    // rounding, then the subtraction's.
    const auto sums = [&](int64_t i) {  // Σ wₖ·xₖ, and the weight of the parts nonzero at i
      float a = 0.0f, w = 0.0f;
      for (const auto& [v, wk] : parts) {
        a = a + wk * v[i];
        if (v[i] != 0.0f) w = w + wk;
      }
      return std::pair{a, w};
    };
    const auto by_hand = [&](int64_t i, bool present) {
      const auto [a, w] = sums(i);
      const float d = !present ? a / 4.0f : w > 0.0f ? a / w : 0.0f;
      return t0[i] - 0.75f * d;
    };
    int64_t moved = 0;
    for (int64_t i = 0; i < layout.numel; ++i) {
      const float want = by_hand(i, false);
      if (theta[i].item<float>() != want) FAIL_CHECK("element " << i << ": " << theta[i].item<float>() << " != " << want);
      moved += want != t0[i];
    }
    CHECK(moved > 0);
    // Another replica: the same bits.
    auto other = theta0.clone();
    outer::RelayBuffers buf2;
    CHECK_FALSE(outer::apply_relay(dec, b, other, layout, common::RelayMean::kAll, 2.0, buf2).has_value());
    CHECK(torch::equal(other, theta));
    // A part left out and not filled in is refused before θ is touched.
    auto left_out = b;
    left_out.parts[1].frame = {};
    left_out.parts[1].own = true;
    auto untouched = theta0.clone();
    CHECK_THROWS_AS(outer::apply_relay(dec, left_out, untouched, layout, common::RelayMean::kAll, 2.0, buf), compress::FrameError);
    CHECK(torch::equal(untouched, theta0));
    // A rate that overflows: refused, θ as it was.
    auto huge = b;
    huge.lr = 3e38f;
    huge.weight_sum = 1e-30;
    auto kept = theta0.clone();
    CHECK(outer::apply_relay(dec, huge, kept, layout, common::RelayMean::kAll, 2.0, buf).has_value());
    CHECK(torch::equal(kept, theta0));

    // outer.relay_mean "present": each element divided by the weight of the frames that sent
    // it (a topk frame decodes to 0 where it sent nothing); one that none sent stays.
    auto pres = theta0.clone();
    CHECK_FALSE(outer::apply_relay(dec, b, pres, layout, common::RelayMean::kPresent, 2.0, buf).has_value());
    int64_t alone = 0, shared = 0, still = 0;
    for (int64_t i = 0; i < layout.numel; ++i) {
      const float want = by_hand(i, true);
      if (pres[i].item<float>() != want) FAIL_CHECK("present, element " << i << ": " << pres[i].item<float>() << " != " << want);
      int senders = 0;
      for (const auto& part : parts) senders += part.first[i] != 0.0f;
      alone += senders == 1;
      shared += senders > 1;
      still += senders == 0;
    }
    CHECK(alone > 0);   // where the two rules differ most (4x here for p0's and p2's elements)
    CHECK(shared > 0);
    CHECK(still > 0);
    CHECK_FALSE(torch::equal(pres, theta));
    auto pres2 = theta0.clone();
    outer::RelayBuffers buf3;
    CHECK_FALSE(outer::apply_relay(dec, b, pres2, layout, common::RelayMean::kPresent, 2.0, buf3).has_value());
    CHECK(torch::equal(pres2, pres));

    // outer.relay_mean "clipped": the plain mean's sum, plus, for each part that did not send
    // an element, the senders' mean there clipped to clip × the least magnitude that part sent
    // in the element's block (256 here, from each tensor's start; the short last ones too).
    const auto least_in_block = [&](const float* v, int64_t i) {
      const auto& slot = layout.slot_at(i);
      const int64_t lo = slot.offset + (i - slot.offset) / 256 * 256;
      const int64_t hi = std::min(slot.offset + slot.numel, lo + 256);
      float least = std::numeric_limits<float>::infinity();
      for (int64_t j = lo; j < hi; ++j) {
        if (v[j] != 0.0f) least = std::min(least, std::fabs(v[j]));
      }
      return std::isfinite(least) ? least : 0.0f;
    };
    for (const float clip : {0.5f, 2.0f}) {
      CAPTURE(clip);
      auto clipped = theta0.clone();
      outer::RelayBuffers buf4;
      CHECK_FALSE(outer::apply_relay(dec, b, clipped, layout, common::RelayMean::kClipped, clip, buf4).has_value());
      // The frames are read sparsely: no frame's values written out densely (no `values`
      // buffer without a trust region) and nothing kept per element and frame (one block's
      // sent positions at most).
      CHECK_FALSE(buf4.values.defined());
      CHECK(buf4.sent.capacity() <= 256);
      int64_t credited = 0, capped = 0;
      for (int64_t i = 0; i < layout.numel; ++i) {
        const auto [a, w] = sums(i);
        const float m = w > 0.0f ? a / w : 0.0f;
        float extra = 0.0f;
        for (const auto& [v, wk] : parts) {
          if (v[i] != 0.0f || m == 0.0f) continue;
          const float f = clip * least_in_block(v, i);
          extra = extra + wk * std::copysign(std::min(std::fabs(m), f), m);
          ++credited;
          capped += f < std::fabs(m);
        }
        const float want = t0[i] - 0.75f * ((a + extra) / 4.0f);
        if (clipped[i].item<float>() != want) FAIL_CHECK("clipped, element " << i << ": " << clipped[i].item<float>() << " != " << want);
      }
      CHECK(credited > capped);  // some credited with the whole mean,
      CHECK(capped > 0);         // some with their own bound
      CHECK_FALSE(torch::equal(clipped, theta));
      CHECK_FALSE(torch::equal(clipped, pres));
    }
    // clip 0 credits nothing: the plain mean, to the bit.
    auto clip0 = theta0.clone();
    outer::RelayBuffers buf5;
    CHECK_FALSE(outer::apply_relay(dec, b, clip0, layout, common::RelayMean::kClipped, 0.0, buf5).has_value());
    CHECK(torch::equal(clip0, theta));
  }

  TEST_CASE("relay: the aggregator keeps the accepted frames in adding order with their weights and never decodes them into delta; a frame that fails its checks is refused on arrival") {
    const common::FlatLayout layout = relay_layout();
    const auto f0 = relay_frame(layout, 8, 11), f1 = relay_frame(layout, 8, 12),
               f2 = relay_frame(layout, 8, 13);
    outer::Aggregator agg(layout, /*norm_bound=*/0, /*keep_frames=*/true);
    agg.begin({"p0", "p1", "p2"}, /*allowance=*/4000);
    CHECK(agg.add("p1", f1, 1000).empty());  // waits for p0's turn
    CHECK(agg.kept().empty());
    auto cut = f2.to_vector();
    cut.pop_back();
    const auto refused = agg.add("p2", net::Frame(std::move(cut)), 4000);
    REQUIRE(refused.size() == 1);
    CHECK(refused[0].peer == "p2");
    CHECK(refused[0].code == net::RefusalCode::kBadFrame);
    CHECK(agg.add("p0", f0, 4000).empty());
    CHECK(agg.finish().empty());
    REQUIRE(agg.kept().size() == 2);
    CHECK(agg.kept()[0].peer == "p0");
    CHECK(agg.kept()[0].weight == 1.0);
    CHECK(agg.kept()[0].frame == f0);
    CHECK(agg.kept()[1].peer == "p1");
    CHECK(agg.kept()[1].weight == 0.25);  // a quarter of the first's tokens
    CHECK(agg.kept()[1].frame == f1);
    CHECK(agg.added() == 2);
    CHECK(agg.weight_sum() == 1.25);
    CHECK_FALSE(agg.delta().defined());  // the relay applies the frames: Δ never computed
    // The next round starts with nothing kept.
    agg.begin({"p0"}, 4000);
    CHECK(agg.kept().empty());
    CHECK(agg.weight_sum() == 0);
  }
}

using test::find_process;
using test::slurp;
using test::start_group;
using test::wait_rounds;

TEST_SUITE("outer_faults") {
  TEST_CASE("SIGTERM to the head checkpoints; --resume continues at the next round with the same theta and momentum") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
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
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
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

TEST_SUITE("pace") {
  TEST_CASE("next_step: H steps without a budget; with one, until it is spent but at least min_inner_steps, never past H or the run") {
    common::Config c;
    c.inner.steps = 110;
    c.outer.inner_steps = 50;
    CHECK(outer::next_step(1, 49, 1e9, c).more);
    CHECK_FALSE(outer::next_step(1, 50, 0, c).more);
    CHECK_FALSE(outer::next_step(3, 10, 0, c).more);  // the run's last round has 10 steps
    CHECK(outer::next_step(3, 10, 0, c).reason.find("last 10") != std::string::npos);
    c.outer.round_budget_s = 2;
    c.outer.min_inner_steps = 3;
    CHECK(outer::next_step(1, 7, 1.99, c).more);
    CHECK_FALSE(outer::next_step(1, 7, 2.0, c).more);
    CHECK(outer::next_step(1, 7, 2.0, c).reason.find("budget") != std::string::npos);
    CHECK(outer::next_step(1, 2, 5.0, c).more);        // below the minimum: one more
    CHECK_FALSE(outer::next_step(1, 3, 5.0, c).more);
    CHECK_FALSE(outer::next_step(1, 50, 0.1, c).more);  // H is the cap
    // A step of 0.8 s: the next one starts only if it would end less than 0.4 s past the budget.
    CHECK(outer::next_step(1, 7, 1.59, c, 0.8).more);
    CHECK_FALSE(outer::next_step(1, 7, 1.61, c, 0.8).more);
  }

  TEST_CASE("budget_carry: chained rounds' over- and undershoots are taken off the next budget, within half a budget") {
    common::Config c;
    c.inner.steps = 1000;
    c.outer.inner_steps = 100;
    CHECK(outer::budget_carry(0.3, 9.0, c) == 0);  // no budget: nothing to carry
    c.outer.round_budget_s = 4.5;
    // Steps of 0.48 s: 9 steps (4.32 s) end nearer 4.5 s than 10 (4.8 s); 0.18 s under, each
    // round. Carried, the next round's budget is 4.68 s and its 10th step ends nearer.
    double carry = outer::budget_carry(0, 4.32, c);
    CHECK(carry == doctest::Approx(-0.18));
    CHECK_FALSE(outer::next_step(2, 9, 4.32, c, 0.48).more);
    CHECK(outer::next_step(2, 9, 4.32, c, 0.48, carry).more);
    CHECK(outer::next_step(2, 10, 4.8, c, 0.48, carry).reason.find("carried over") != std::string::npos);
    carry = outer::budget_carry(carry, 4.8, c);
    CHECK(carry == doctest::Approx(0.12));
    // Over 40 such rounds the carry stays within a step: the rounds keep the budget's clock.
    double total = 0;
    carry = 0;
    for (int r = 0; r < 40; ++r) {
      int64_t done = 0;
      while (outer::next_step(2, done, done * 0.48, c, 0.48, carry).more) ++done;
      total += done * 0.48;
      carry = outer::budget_carry(carry, done * 0.48, c);
    }
    CHECK(std::abs(total - 40 * 4.5) < 0.48);
    // Kept within ± budget / 2: a round capped by H does not bank time without end.
    CHECK(outer::budget_carry(-2.0, 1.0, c) == doctest::Approx(-2.25));
    CHECK(outer::budget_carry(2.0, 9.0, c) == doctest::Approx(2.25));
  }

  TEST_CASE("schedule_position: the step index without a budget; with one, the round's progress in time or steps, whichever is further") {
    common::Config c;
    c.inner.steps = 1000;
    c.outer.inner_steps = 40;
    CHECK(outer::schedule_position(3, 7, 123.0, c) == doctest::Approx(87));
    c.outer.round_budget_s = 10;
    // A provider 4x slower: 10 steps in the budget, spread over the round's 40 schedule steps.
    CHECK(outer::schedule_position(3, 5, 5.0, c) == doctest::Approx(80 + 20));
    // A fast one capped by H: its steps lead.
    CHECK(outer::schedule_position(3, 30, 5.0, c) == doctest::Approx(80 + 30));
    CHECK(outer::schedule_position(3, 9, 50.0, c) == doctest::Approx(80 + 39));  // never past the round
  }

  TEST_CASE("contribution_weight: tokens over the first contribution's, capped by the round's allowance") {
    CHECK(outer::contribution_weight(400, 0, 1000) == 1.0);  // the first weighs 1
    CHECK(outer::contribution_weight(100, 400, 1000) == doctest::Approx(0.25));
    CHECK(outer::contribution_weight(400, 100, 1000) == doctest::Approx(4.0));
    CHECK(outer::contribution_weight(5000, 1000, 1000) == doctest::Approx(1.0));  // capped
    CHECK(outer::contribution_weight(300, 200, 0) == doctest::Approx(1.5));       // no cap given
  }

  TEST_CASE("the aggregator's delta is the token-weighted mean of the contributions") {
    common::FlatLayout layout;
    layout.append("w", {4, 8});
    const auto a = torch::randn({32}), b = torch::randn({32}), d = torch::randn({32});
    auto frame = [&](const torch::Tensor& v) {
      compress::CodecConfig cc;
      cc.codec = compress::Codec::kFp32;
      cc.error_feedback = false;
      compress::Encoder enc(cc);
      std::vector<uint8_t> out;
      compress::encode(enc, layout, v, out);
      return net::Frame(std::move(out));
    };
    outer::Aggregator agg(layout);
    agg.begin({"p0", "p1", "p2"}, /*allowance=*/4000);
    CHECK(agg.add("p0", frame(a), 4000).empty());
    CHECK(agg.add("p1", frame(b), 1000).empty());  // a provider 4x slower in a budgeted round
    CHECK(agg.add("p2", frame(d), 4000).empty());
    CHECK(agg.finish().empty());
    const auto want = (4000 * a + 1000 * b + 4000 * d) / 9000;
    CHECK((agg.delta() - want).abs().max().item<double>() < 1e-6);

    // Norms are judged per full round: two providers, one 8x slower whose δ is 8x smaller.
    // Unscaled, the fast one's norm is 8x its only peer's and over a bound of 4; scaled, both
    // are the same and both are in. A fast one 8x over its full-round peer is still refused.
    outer::Aggregator judged(layout, /*norm_bound=*/4);
    judged.begin({"fast", "slow"}, 8000);
    CHECK(judged.add("fast", frame(a), 8000).empty());
    CHECK(judged.add("slow", frame(a / 8), 1000).empty());
    CHECK(judged.finish().empty());
    CHECK(judged.added() == 2);
    judged.begin({"fast", "slow"}, 8000);
    CHECK(judged.add("slow", frame(a / 8), 1000).empty());  // waits for the fast one's turn
    const auto refused = judged.add("fast", frame(8 * a), 8000);
    REQUIRE(refused.size() == 1);
    CHECK(refused[0].peer == "fast");
    CHECK(refused[0].code == net::RefusalCode::kOutlier);
    CHECK(judged.finish().empty());
  }

  TEST_CASE("full_round_norm: a contribution's norm scaled to the round's allowance of tokens, never down") {
    CHECK(outer::full_round_norm(2.0, 1000, 4000) == doctest::Approx(8.0));
    CHECK(outer::full_round_norm(2.0, 4000, 4000) == 2.0);  // fixed H: as it is
    CHECK(outer::full_round_norm(2.0, 9000, 4000) == 2.0);  // a claim over it is refused elsewhere
    CHECK(outer::full_round_norm(2.0, 0, 4000) == 2.0);
    CHECK(outer::full_round_norm(2.0, 1000, 0) == 2.0);     // no allowance given
  }

  TEST_CASE("chains_next_round only with overlap = delayed and before the last round") {
    common::Config c;
    c.inner.steps = 100;
    c.outer.inner_steps = 25;
    CHECK_FALSE(outer::chains_next_round(1, c));
    c.outer.overlap = common::Overlap::kDelayed;
    CHECK(outer::chains_next_round(1, c));
    CHECK(outer::chains_next_round(3, c));
    CHECK_FALSE(outer::chains_next_round(4, c));  // the last round waits for its update
  }

  TEST_CASE("fold_step: outer.delay_steps, or a tenth of H (at least 1)") {
    common::Config c;
    c.outer.inner_steps = 50;
    CHECK(outer::fold_step(c) == 5);
    c.outer.inner_steps = 3;
    CHECK(outer::fold_step(c) == 1);
    c.outer.delay_steps = 3;
    CHECK(outer::fold_step(c) == 3);
  }

  TEST_CASE("outer.topk_down: the downlink's values per block (0: outer.topk); checked against the block; not hashed when 0") {
    common::Config c;
    const std::string before = common::config_hash(c);
    c.outer.codec_up = c.outer.codec_down = common::CodecKind::kTopk;
    c.outer.block_size = 4096;
    c.outer.topk = 64;
    CHECK(outer::uplink_codec(c.outer).topk == 64);
    CHECK(outer::downlink_codec(c.outer).topk == 64);
    c.outer.topk_down = 256;
    CHECK(outer::uplink_codec(c.outer).topk == 64);
    CHECK(outer::downlink_codec(c.outer).topk == 256);
    nlohmann::json j = common::to_json(common::Config{});
    j["outer"]["topk_down"] = 0;
    CHECK(common::config_hash(common::parse_config(j)) == before);
    j["outer"]["topk_down"] = 16;
    CHECK(common::config_hash(common::parse_config(j)) != before);
    j["outer"]["codec_down"] = "topk";
    j["outer"]["topk_down"] = 257;  // block_size 256
    CHECK_THROWS_WITH_AS(common::parse_config(j), doctest::Contains("outer.topk_down"), common::ConfigError);
  }

  TEST_CASE("outer.topk_bits / topk_bits_down: 2 or 4 bits a value, per link (0 down: as up); not hashed at their defaults") {
    common::Config c;
    const std::string before = common::config_hash(c);
    c.outer.codec_up = c.outer.codec_down = common::CodecKind::kTopk;
    CHECK(outer::uplink_codec(c.outer).topk_bits == 2);
    CHECK(outer::downlink_codec(c.outer).topk_bits == 2);
    c.outer.topk_bits = 4;
    CHECK(outer::uplink_codec(c.outer).topk_bits == 4);
    CHECK(outer::downlink_codec(c.outer).topk_bits == 4);
    c.outer.topk_bits_down = 2;
    CHECK(outer::uplink_codec(c.outer).topk_bits == 4);
    CHECK(outer::downlink_codec(c.outer).topk_bits == 2);
    nlohmann::json j = common::to_json(common::Config{});
    j["outer"]["topk_bits"] = 2;
    j["outer"]["topk_bits_down"] = 0;
    CHECK(common::config_hash(common::parse_config(j)) == before);
    j["outer"]["topk_bits"] = 4;
    CHECK(common::config_hash(common::parse_config(j)) != before);
    j["outer"]["topk_bits"] = 3;
    CHECK_THROWS_WITH_AS(common::parse_config(j), doctest::Contains("outer.topk_bits"), common::ConfigError);
    j["outer"]["topk_bits"] = 2;
    j["outer"]["topk_bits_down"] = 1;
    CHECK_THROWS_WITH_AS(common::parse_config(j), doctest::Contains("outer.topk_bits_down"), common::ConfigError);
  }

  TEST_CASE("fold_now: at delay_steps with outer.fold = step whenever the update came; as soon as it has with arrival") {
    common::Config c;
    c.outer.inner_steps = 50;
    c.outer.overlap = common::Overlap::kDelayed;  // fold_step 5
    CHECK_FALSE(outer::fold_now(0, true, c).fold);  // "step": arrival does not matter
    CHECK_FALSE(outer::fold_now(4, true, c).fold);
    auto v = outer::fold_now(5, false, c);
    CHECK(v.fold);
    CHECK(v.wait);
    CHECK(v.reason.find("waiting") != std::string::npos);
    CHECK_FALSE(outer::fold_now(5, true, c).wait);
    c.outer.fold = common::Fold::kArrival;
    CHECK_FALSE(outer::fold_now(2, false, c).fold);
    v = outer::fold_now(2, true, c);
    CHECK(v.fold);
    CHECK_FALSE(v.wait);
    CHECK(v.reason.find("arrival") != std::string::npos);
    CHECK(outer::fold_now(0, true, c).fold);  // already in before the first step
    v = outer::fold_now(5, false, c);  // delay_steps stays the latest fold
    CHECK(v.fold);
    CHECK(v.wait);
  }

  TEST_CASE("XLOCO_THROTTLE: the named provider's factor, 1 for others, malformed lists refused by name") {
    CHECK(outer::throttle_factor(nullptr, "p") == 1.0);
    CHECK(outer::throttle_factor("provider-3=4,provider-1=2", "provider-3") == 4.0);
    CHECK(outer::throttle_factor("provider-3=4,provider-1=2", "provider-1") == 2.0);
    CHECK(outer::throttle_factor("provider-3=4", "provider-0") == 1.0);
    for (const char* bad : {"provider-3", "provider-3=0.5", "=4", "provider-3=4x"}) {
      CHECK_THROWS_WITH_AS(outer::throttle_factor(bad, "p"), doctest::Contains("XLOCO_THROTTLE"), common::ConfigError);
    }
  }

  TEST_CASE("config: overlap and time budgets are checked; overlap is not hashed, a run without a budget hashes as before, keep_local only when set") {
    common::Config c;
    const std::string before = common::config_hash(c);
    nlohmann::json j = common::to_json(c);
    j["outer"]["overlap"] = "eager";
    CHECK_THROWS_WITH_AS(common::parse_config(j), doctest::Contains("outer.overlap"), common::ConfigError);
    j["outer"]["overlap"] = "delayed";  // a provider's own business: not hashed
    CHECK(common::config_hash(common::parse_config(j)) == before);
    j["outer"]["fold"] = "arrival";
    CHECK(common::config_hash(common::parse_config(j)) == before);
    j["outer"]["fold"] = "soon";
    CHECK_THROWS_WITH_AS(common::parse_config(j), doctest::Contains("outer.fold"), common::ConfigError);
    j["outer"]["fold"] = "step";
    j["outer"]["round_budget_s"] = 30;  // the schedule's: hashed
    CHECK(common::config_hash(common::parse_config(j)) != before);
    j["outer"]["round_budget_s"] = 0;
    j["outer"]["delay_steps"] = 51;
    CHECK_THROWS_WITH_AS(common::parse_config(j), doctest::Contains("delay_steps"), common::ConfigError);
    j["outer"]["delay_steps"] = 0;
    j["outer"]["overlap"] = "none";
    j["outer"]["min_inner_steps"] = 60;  // above H = 50
    CHECK_THROWS_WITH_AS(common::parse_config(j), doctest::Contains("min_inner_steps"), common::ConfigError);
    j["outer"]["min_inner_steps"] = 1;
    CHECK(common::config_hash(common::parse_config(j)) == before);
    j["outer"]["keep_local"] = 0;  // runs from before it hash as before
    CHECK(common::config_hash(common::parse_config(j)) == before);
    j["outer"]["keep_local"] = 0.5;  // it changes θ_pub: hashed
    CHECK(common::config_hash(common::parse_config(j)) != before);
    j["outer"]["keep_local"] = 1;  // θ_pub would never come in
    CHECK_THROWS_WITH_AS(common::parse_config(j), doctest::Contains("outer.keep_local"), common::ConfigError);
  }
}

TEST_SUITE("advise") {
  using xloco::outer::AdviseInput;

  TEST_CASE("the round model: compute + link, or the longer of the two with overlap") {
    AdviseInput in;
    in.params = 100e6;
    in.step_s = {2.0};
    in.link_mbit = {100, 10};
    // int8 both ways: 200 MB a round; 16 s at 100 Mbit/s, 160 s at 10. H = 50: 100 s compute.
    auto p = xloco::outer::predict(in, 50, "int8", "int8", false);
    CHECK(p.bytes_up == doctest::Approx(100e6));
    CHECK(p.bytes_down == doctest::Approx(100e6));
    CHECK(p.round_s == doctest::Approx(260.0));
    CHECK(p.utilization == doctest::Approx(100.0 / 260.0));
    CHECK(p.slowest == 1);
    p = xloco::outer::predict(in, 50, "int8", "int8", true);
    CHECK(p.round_s == doctest::Approx(160.0));
    // relay: K - 1 frames of 0.044 bytes a parameter down.
    in.link_mbit = {100};
    in.providers = 4;
    p = xloco::outer::predict(in, 50, "topk", "relay", false);
    CHECK(p.bytes_down == doctest::Approx(3 * 0.044 * 100e6));
  }

  TEST_CASE("advice: fast links keep int8 and a small H; a slow one gets overlap, then the sparse codec") {
    AdviseInput in;
    in.params = 101e6;
    in.step_s = {2.4};
    in.link_mbit = {1000};
    in.providers = 4;
    auto a = xloco::outer::advise(in);
    CHECK(a.ok);
    CHECK(a.codec_up == "int8");
    CHECK(a.codec_down == "int8");
    CHECK(!a.overlap);
    CHECK(a.inner_steps == 25);  // 1.6 s of link beside 60 s of compute: 97.4 %
    CHECK(a.utilization >= 0.95);
    // The scale rehearsal's 10 Mbit/s provider: int8 needs 162 s a round.
    in.link_mbit = {100, 100, 50, 10};
    a = xloco::outer::advise(in);
    CHECK(a.ok);
    CHECK(a.overlap);
    CHECK(a.codec_up == "int8");
    CHECK(a.inner_steps == 100);
    CHECK(a.delay_steps > 0);
    CHECK(a.delay_steps == 81);  // 1.2 x 161.6 s of link / 2.4 s a step
    CHECK(a.reason.find("provider-3's link needs 161.6 s") != std::string::npos);
    CHECK(a.set_flags.find("outer.overlap=delayed") != std::string::npos);
    CHECK(a.recipe == "wan");
    CHECK(a.set_flags.find("--set outer.recipe=wan") != std::string::npos);
    // At H <= 50 only the sparse codec with overlap keeps up.
    in.max_h = 50;
    a = xloco::outer::advise(in);
    CHECK(a.codec_up == "topk");
    CHECK(a.codec_down == "relay");
    CHECK(a.set_flags.find("outer.momentum=0") != std::string::npos);
    // Nothing reaches 95 % at 1 Mbit/s and H <= 25: the closest, said so.
    in.link_mbit = {1};
    in.max_h = 25;
    a = xloco::outer::advise(in);
    CHECK(!a.ok);
    CHECK(a.reason.rfind("no setting reaches the target", 0) == 0);
  }

  TEST_CASE("advice at K = 64: the relayed downlink (63 frames) is past an int8 update") {
    AdviseInput in;
    in.params = 101e6;
    in.step_s = {2.4};
    in.link_mbit = {20};
    in.providers = 64;
    in.max_h = 50;
    const auto a = xloco::outer::advise(in);
    CHECK(a.codec_down != "relay");
    CHECK(a.reason.find("at K = 64 a relayed downlink") != std::string::npos);
  }

  TEST_CASE("advice: unequal step times get recipe unequal with a round budget") {
    AdviseInput in;
    in.params = 101e6;
    in.step_s = {2.4, 2.4, 2.4, 4.8};
    in.link_mbit = {1000};
    const auto a = xloco::outer::advise(in);
    CHECK(a.recipe == "unequal");
    CHECK(a.round_budget_s == doctest::Approx(0.9 * a.inner_steps * 2.4).epsilon(0.01));
    CHECK(a.set_flags.find("outer.recipe=unequal") != std::string::npos);
    in.step_s = {2.4};
    CHECK(xloco::outer::advise(in).recipe == "lan");
  }

  TEST_CASE("the head's advice from its measurements: silent at 95 %, names the link that costs") {
    xloco::outer::RunMeasured m;
    m.params = 101e6;
    m.inner_steps = 50;
    m.codec_up = m.codec_down = "int8";
    m.rounds = 3;
    m.utilization = 0.60;
    // provider-3 sends 101 MB in 80 s (10 Mbit/s); the others in 1 s.
    for (int i = 0; i < 4; ++i) {
      m.providers.push_back({"provider-" + std::to_string(i), 120.0, i == 3 ? 80.8 : 1.0, 101e6});
    }
    const std::string text = xloco::outer::advise_run(m);
    INFO(text);
    CHECK(text.rfind("utilization 60 %: provider-3's link needs", 0) == 0);
    CHECK(text.find("recipe ") != std::string::npos);
    CHECK(text.find("--set outer.") != std::string::npos);
    // At or above the target, or too early to tell: nothing.
    m.utilization = 0.96;
    CHECK(xloco::outer::advise_run(m).empty());
    m.utilization = 0.60;
    m.rounds = 1;
    CHECK(xloco::outer::advise_run(m).empty());
    m.rounds = 3;
    // Fast links but a low utilization: the links are not the cause, and the advice says so.
    for (auto& p : m.providers) p.link_s = 0.5;
    const std::string other = xloco::outer::advise_run(m);
    INFO(other);
    CHECK(other.find("the links explain little of it") != std::string::npos);
    CHECK(other.find("--set") == std::string::npos);
  }

  TEST_CASE("relay's downlink against int8: silent while it is smaller, a warning past K = 23") {
    using xloco::outer::relay_download_warning;
    CHECK(relay_download_warning(4, "topk", 176, 4096).empty());
    CHECK(relay_download_warning(23, "topk", 176, 4096).empty());  // 22 x 0.044 = 0.97 of int8's
    CHECK(!relay_download_warning(24, "topk", 176, 4096).empty());  // 23 x 0.044 = 1.01
    const std::string w = relay_download_warning(64, "topk", 176, 4096);
    INFO(w);
    CHECK(w.find("K = 64: each provider downloads 63 frames") != std::string::npos);
    CHECK(w.find("only up to K = 23") != std::string::npos);
    CHECK(w.find("outer.codec_down = \"int8\"") != std::string::npos);
    // A denser top-k reaches the break-even sooner; an int8 uplink relayed never pays past K = 2.
    CHECK(!relay_download_warning(16, "topk", 704, 4096).empty());
    CHECK(!relay_download_warning(3, "int8", 0, 256).empty());
    CHECK(relay_download_warning(2, "int8", 0, 256).empty());
  }

  TEST_CASE("advice refuses inputs it cannot use") {
    AdviseInput in;
    in.params = 1e6;
    in.step_s = {1, 2};
    in.link_mbit = {10, 10, 10};
    CHECK_THROWS_AS(xloco::outer::advise(in), xloco::common::ConfigError);
    in.link_mbit = {10, -1};
    CHECK_THROWS_AS(xloco::outer::advise(in), xloco::common::ConfigError);
  }
}
