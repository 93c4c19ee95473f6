#include "common/config.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <cmath>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/json_text.h"
#include "common/metrics.h"
#include "common/text.h"

namespace xloco::common {
namespace {

using json = nlohmann::json;

struct Range {
  double lo, hi;
};
using Choices = std::vector<std::string>;
struct Flag {};
struct Named {};  // an enum field: its names come from kNames<E>

// Every enum's names, in enum order: the one place they are spelled.
template <class E> constexpr std::array<const char*, 0> kNames{};
template <> constexpr std::array kNames<DatasetKind>{"kjv", "fmnist", "tokens"};
template <> constexpr std::array kNames<Sharding>{"iid", "books", "dirichlet", "contiguous"};
template <> constexpr std::array kNames<ModelKind>{"gpt", "cnn", "torchscript"};
template <> constexpr std::array kNames<CodecKind>{"fp32", "bf16", "int8", "int4", "topk"};
template <> constexpr std::array kNames<Downlink>{"quantized", "relay"};
template <> constexpr std::array kNames<Kernels>{"fused", "aten"};
template <> constexpr std::array kNames<Precision>{"fp32", "bf16"};
template <> constexpr std::array kNames<Overlap>{"none", "delayed"};
template <> constexpr std::array kNames<Fold>{"step", "arrival"};
template <> constexpr std::array kNames<RelayMean>{"all", "present", "clipped"};

template <class E>
const char* name_of(E e) {
  return kNames<E>.at(static_cast<size_t>(e));
}

// When a key does something, decided by another key (issue 53): set away from its default where
// its rule does not hold, it is refused naming the key that governs it.
struct When {
  const char* governing;  // the key that decides whether a key applies
  const char* text;       // when it applies, in words
  bool (*holds)(const Config&);
};
bool any_topk(const Config& c) {
  return c.outer.codec_up == CodecKind::kTopk ||
         (c.outer.downlink == Downlink::kQuantized && c.outer.codec_down == CodecKind::kTopk);
}
constexpr When kDelayed{"outer.overlap", "outer.overlap = \"delayed\"",
                        [](const Config& c) { return c.outer.overlap != Overlap::kNone; }};
constexpr When kTopkCodec{"outer.codec_up", "a topk codec (outer.codec_up or outer.codec_down = \"topk\")",
                          any_topk};
constexpr When kTopkDown{"outer.codec_down", "outer.codec_down = \"topk\"",
                         [](const Config& c) {
                           return c.outer.downlink == Downlink::kQuantized &&
                                  c.outer.codec_down == CodecKind::kTopk;
                         }};
constexpr When kQuantizedDown{"outer.downlink", "outer.downlink = \"quantized\"",
                              [](const Config& c) { return c.outer.downlink == Downlink::kQuantized; }};
constexpr When kRelayDown{"outer.downlink", "outer.downlink = \"relay\"",
                          [](const Config& c) { return c.outer.downlink == Downlink::kRelay; }};
constexpr When kClipped{"outer.relay_mean", "outer.relay_mean = \"clipped\"",
                        [](const Config& c) { return c.outer.relay_mean == RelayMean::kClipped; }};
constexpr When kBudget{"outer.round_budget_s", "a time budget (outer.round_budget_s > 0)",
                       [](const Config& c) { return c.outer.round_budget_s > 0; }};
constexpr When kDirichlet{"data.sharding", "data.sharding = \"dirichlet\"",
                          [](const Config& c) { return c.data.sharding == Sharding::kDirichlet; }};

// Who must agree on a key. agreed: the head and every provider (it is in config_hash); own: each
// machine's own (paths, threads, how a provider overlaps its rounds); head: the head's alone
// (its deadlines and trust rules), not hashed either.
enum class Scope { kAgreed, kOwn, kHead };
constexpr const char* kScopeNames[] = {"agreed", "own", "head"};
// How an agreed key enters config_hash. kAlways: as it is. kUnlessDefault: only where it is set
// away from its default (`off` says what counts as its default when that is a range), so that
// runs from before the key existed hash as they did: every key added from now on is one of
// these. kWhenApplies: only where its `when` holds.
enum class Hash { kAlways, kUnlessDefault, kWhenApplies };

struct Key {
  const char* name;
  Scope scope = Scope::kAgreed;
  Hash hash = Hash::kAlways;
  const When* when = nullptr;
  bool (*off)(const Config&) = nullptr;
};
constexpr Key agreed(const char* n, const When* w = nullptr) { return {n, Scope::kAgreed, Hash::kAlways, w}; }
// Added after checkpoints existed: hashed only away from its default.
constexpr Key later(const char* n, const When* w = nullptr, bool (*off)(const Config&) = nullptr) {
  return {n, Scope::kAgreed, Hash::kUnlessDefault, w, off};
}
constexpr Key own(const char* n, const When* w = nullptr) { return {n, Scope::kOwn, Hash::kAlways, w}; }
constexpr Key head(const char* n, const When* w = nullptr) { return {n, Scope::kHead, Hash::kAlways, w}; }

// Every config field, once: its row (scope, when it applies, how it is hashed), its place in
// Config and its allowed values. parse, dump, the unknown- and inert-key checks, config_hash and
// `config --explain` all walk this table, so a new field is one line here plus one in config.h
// (a new agreed key: `later`, so that existing checkpoints keep resuming).
template <class Visitor>
void visit_fields(Config& c, Visitor&& v) {
  v(own("run.name"), c.run.name, Choices{});  // checked in every message by name, not hashed
  v(own("run.dir"), c.run.dir, Choices{});
  v(agreed("run.seed"), c.run.seed, Range{0, 9.0e15});  // hashed as "seed"
  v(own("run.device"), c.run.device, Choices{});
  v(own("run.threads"), c.run.threads, Range{0, 1024});
  v(own("run.blas_threads"), c.run.blas_threads, Range{0, 1024});
  v(own("run.kernels"), c.run.kernels, Named{});
  v(own("run.precision"), c.run.precision, Named{});
  v(agreed("data.dataset"), c.data.dataset, Named{});
  v(agreed("data.sharding"), c.data.sharding, Named{});
  v(agreed("data.dirichlet_alpha", &kDirichlet), c.data.dirichlet_alpha, Range{1e-3, 1e6});
  v(own("data.path"), c.data.path, Choices{});
  v(own("data.cache_dir"), c.data.cache_dir, Choices{});
  v(agreed("model.kind"), c.model.kind, Named{});
  v(own("model.path"), c.model.path, Choices{});  // where it lies; its bytes are hashed
  v(own("model.preset"), c.model.preset, Choices{"", "tiny", "gpt2-small", "gpt2-medium"});
  // A byte-level run hashes as it did before model.vocab_size existed.
  v(later("model.vocab_size", nullptr,
          [](const Config& c) {
            return c.model.vocab_size == 0 ||
                   (c.data.dataset == DatasetKind::kKjv && c.model.vocab_size == 256);
          }),
    c.model.vocab_size, Range{0, 1 << 24});
  v(agreed("model.d_model"), c.model.d_model, Range{8, 65536});
  v(agreed("model.n_layer"), c.model.n_layer, Range{1, 1024});
  v(agreed("model.n_head"), c.model.n_head, Range{1, 1024});
  v(agreed("model.seq_len"), c.model.seq_len, Range{2, 1 << 20});
  v(agreed("inner.lr"), c.inner.lr, Range{0, 10});
  v(agreed("inner.min_lr"), c.inner.min_lr, Range{0, 10});
  v(agreed("inner.warmup_steps"), c.inner.warmup_steps, Range{0, 1e9});
  v(agreed("inner.steps"), c.inner.steps, Range{1, 1e9});
  v(agreed("inner.batch_size"), c.inner.batch_size, Range{1, 1 << 20});
  v(agreed("inner.weight_decay"), c.inner.weight_decay, Range{0, 10});
  v(agreed("inner.beta1"), c.inner.beta1, Range{0, 0.999999});
  v(agreed("inner.beta2"), c.inner.beta2, Range{0, 0.999999});
  v(agreed("inner.eps"), c.inner.eps, Range{1e-12, 1});
  v(agreed("inner.grad_clip"), c.inner.grad_clip, Range{0, 1e6});
  v(agreed("inner.eval_every"), c.inner.eval_every, Range{0, 1e9});
  v(agreed("inner.eval_batches"), c.inner.eval_batches, Range{1, 1e6});
  v(own("inner.log_every"), c.inner.log_every, Range{1, 1e9});
  v(own("inner.checkpoint_every"), c.inner.checkpoint_every, Range{0, 1e9});
  v(own("inner.bucket_kb"), c.inner.bucket_kb, Range{4, 1 << 22});
  v(own("outer.recipe"), c.outer.recipe, Choices{"", "lan", "wan", "wan-sparse", "unequal"});  // the keys it sets are hashed themselves
  v(agreed("outer.inner_steps"), c.outer.inner_steps, Range{1, 1e9});
  v(agreed("outer.lr"), c.outer.lr, Range{0, 100});
  v(later("outer.lr_end", nullptr, [](const Config& c) { return c.outer.lr_end < 0; }),
    c.outer.lr_end, Range{-1, 100});
  v(agreed("outer.momentum"), c.outer.momentum, Range{0, 0.999999});
  v(agreed("outer.nesterov"), c.outer.nesterov, Flag{});
  v(agreed("outer.codec_up"), c.outer.codec_up, Named{});
  // Hashed as outer.codec_down "relay" (config_hash), as relay runs hashed before it was a key.
  v(later("outer.downlink", nullptr, [](const Config&) { return true; }), c.outer.downlink, Named{});
  v(Key{"outer.codec_down", Scope::kAgreed, Hash::kWhenApplies, &kQuantizedDown},
    c.outer.codec_down, Named{});
  v(later("outer.relay_mean", &kRelayDown), c.outer.relay_mean, Named{});
  v(Key{"outer.relay_clip", Scope::kAgreed, Hash::kWhenApplies, &kClipped}, c.outer.relay_clip,
    Range{0, 1e6});
  v(agreed("outer.block_size"), c.outer.block_size, Range{2, 1 << 20});
  v(agreed("outer.topk", &kTopkCodec), c.outer.topk, Range{0, 1 << 16});
  v(later("outer.topk_down", &kTopkDown), c.outer.topk_down, Range{0, 1 << 16});
  v(later("outer.topk_bits", &kTopkCodec), c.outer.topk_bits, Range{2, 4});
  v(later("outer.topk_bits_down", &kTopkDown), c.outer.topk_bits_down, Range{0, 4});
  // compared as the encoder's float, so a β that rounds to 1 hashes as 1
  v(later("outer.ef_decay", nullptr,
          [](const Config& c) { return static_cast<float>(c.outer.ef_decay) == 1.0f; }),
    c.outer.ef_decay, Range{0, 1});
  v(agreed("outer.zstd_level"), c.outer.zstd_level, Range{0, 19});
  v(head("outer.providers"), c.outer.providers, Range{1, 4096});
  v(head("outer.min_providers"), c.outer.min_providers, Range{1, 4096});
  v(head("outer.checkpoint_every"), c.outer.checkpoint_every, Range{0, 1e9});
  v(head("outer.keep_checkpoints"), c.outer.keep_checkpoints, Range{1, 1e6});
  v(agreed("outer.eval_every"), c.outer.eval_every, Range{0, 1e9});
  v(head("outer.round_timeout_s"), c.outer.round_timeout_s, Range{1, 1e7});
  v(head("outer.deadline_multiple"), c.outer.deadline_multiple, Range{1, 1000});
  v(head("outer.deadline_min_s"), c.outer.deadline_min_s, Range{0.1, 1e7});
  v(head("outer.start_grace_s"), c.outer.start_grace_s, Range{0, 1e7});
  v(own("outer.heartbeat_s"), c.outer.heartbeat_s, Range{0.05, 3600});
  v(head("outer.dead_after_s"), c.outer.dead_after_s, Range{0.2, 1e7});
  v(head("outer.hello_interval_s"), c.outer.hello_interval_s, Range{0, 1e6});
  v(head("outer.norm_bound"), c.outer.norm_bound, Range{0, 1e12});
  v(head("outer.norm_clip"), c.outer.norm_clip, Flag{});
  v(agreed("outer.trust_region"), c.outer.trust_region, Range{0, 1e6});
  v(head("outer.score"), c.outer.score, Flag{});
  v(head("outer.score_batches"), c.outer.score_batches, Range{1, 1e6});
  v(head("outer.score_margin"), c.outer.score_margin, Range{-1e6, 1e6});
  v(head("outer.score_relative"), c.outer.score_relative, Range{0, 1});
  v(own("outer.head_timeout_s"), c.outer.head_timeout_s, Range{1, 1e7});
  v(agreed("outer.shared_data"), c.outer.shared_data, Flag{});
  v(own("outer.overlap"), c.outer.overlap, Named{});  // the head's rules are the same either way
  v(own("outer.delay_steps", &kDelayed), c.outer.delay_steps, Range{0, 1e9});
  v(own("outer.fold", &kDelayed), c.outer.fold, Named{});
  v(later("outer.keep_local"), c.outer.keep_local, Range{0, 0.99});
  v(later("outer.fragments"), c.outer.fragments, Range{1, 1e6});
  v(later("outer.round_budget_s"), c.outer.round_budget_s, Range{0, 1e7});
  v(Key{"outer.min_inner_steps", Scope::kAgreed, Hash::kWhenApplies, &kBudget},
    c.outer.min_inner_steps, Range{1, 1e9});
}

// The recipes (README "Recipes"; measured in experiments/plans/recipes.json). Each sets only
// outer keys; the model, data and H (outer.inner_steps: `xloco advise` picks it from your
// links) stay yours.
// wan and unequal: int8 with overlapped rounds (unequal adds the budget the user must set).
const std::vector<std::string> kOverlapped = {
    "outer.codec_up=int8", "outer.codec_down=int8", "outer.block_size=256", "outer.lr=0.7",
    "outer.momentum=0.8", "outer.nesterov=true", "outer.overlap=delayed", "outer.fold=arrival",
    "outer.keep_local=0.5"};

const std::vector<RecipeInfo> kRecipes = {
    {"lan",
     "every link 1 Gbit/s or more (one datacentre, a LAN): DiLoCo as published, int8 both ways, "
     "nothing overlapped",
     {"outer.codec_up=int8", "outer.codec_down=int8", "outer.block_size=256", "outer.lr=0.7",
      "outer.momentum=0.9", "outer.nesterov=true", "outer.overlap=none"}},
    {"wan",
     "links of 5-100 Mbit/s, providers of about equal speed: int8, each round's update folded in "
     "when it arrives while the next round trains",
     kOverlapped},
    {"wan-sparse",
     "links too slow for int8 at your H (`xloco advise` says so): 2-bit top-k up, the accepted "
     "frames relayed down exactly, outer SGD",
     {"outer.codec_up=topk", "outer.downlink=relay", "outer.block_size=4096", "outer.topk=176",
      "outer.momentum=0", "outer.nesterov=true", "outer.lr=2.5", "outer.lr_end=1.25",
      "outer.ef_decay=0.6", "outer.relay_mean=clipped", "outer.overlap=none"}},
    {"unequal",
     "providers of unequal speed: time-budgeted rounds (set outer.round_budget_s a little below "
     "your fast providers' time for H steps), int8, overlapped",
     kOverlapped},
};

// The recipe named `name`, or nullptr.
const RecipeInfo* find_recipe(const std::string& name) {
  for (const auto& r : kRecipes) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

const json* find_dotted(const json& j, const std::string& dotted) {
  const json* cur = &j;
  std::stringstream ss(dotted);
  std::string part;
  while (std::getline(ss, part, '.')) {
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(part);
    if (it == cur->end()) return nullptr;
    cur = &*it;
  }
  return cur;
}

std::string range_text(const Range& r) {
  return fmt::format("[{:g}, {:g}]", r.lo, r.hi);
}

void set_field(const std::string& key, const json& v, std::string& out, const Choices& choices) {
  XLOCO_ENFORCE(v.is_string(), ConfigError, "config: {} must be a string, got {}", key, v.dump());
  out = v.get<std::string>();
  if (!choices.empty()) {
    bool ok = false;
    for (const auto& c : choices) ok = ok || c == out;
    XLOCO_ENFORCE(ok, ConfigError, "config: {} is \"{}\"; allowed: {}", key, out,
                  fmt::format("{}", fmt::join(choices, ", ")));
  }
}

template <class E>
void set_field(const std::string& key, const json& v, E& out, const Named&) {
  XLOCO_ENFORCE(v.is_string(), ConfigError, "config: {} must be a string, got {}", key, v.dump());
  const auto& names = kNames<E>;
  for (size_t i = 0; i < names.size(); ++i) {
    if (v.get<std::string>() == names[i]) {
      out = static_cast<E>(i);
      return;
    }
  }
  throw ConfigError(fmt::format("config: {} is {}; allowed: {}", key, v.dump(),
                                fmt::join(names, ", ")));
}

void set_field(const std::string& key, const json& v, bool& out, const Flag&) {
  XLOCO_ENFORCE(v.is_boolean(), ConfigError, "config: {} must be true or false, got {}", key,
                v.dump());
  out = v.get<bool>();
}

template <class Num>
void set_field(const std::string& key, const json& v, Num& out, const Range& r) {
  XLOCO_ENFORCE(v.is_number(), ConfigError, "config: {} must be a number in {}, got {}", key,
                range_text(r), v.dump());
  const double d = v.get<double>();
  XLOCO_ENFORCE(std::isfinite(d) && d >= r.lo && d <= r.hi, ConfigError,
                "config: {} = {} is out of range; allowed {}", key, v.dump(), range_text(r));
  if constexpr (std::is_integral_v<Num>) {
    XLOCO_ENFORCE(v.is_number_integer() || d == std::floor(d), ConfigError,
                  "config: {} must be an integer, got {}", key, v.dump());
    out = static_cast<Num>(d);
  } else {
    out = static_cast<Num>(d);
  }
}

void collect_leaves(const json& j, const std::string& prefix, std::vector<std::string>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it->is_object()) {
      collect_leaves(*it, key, out);
    } else {
      out.push_back(key);
    }
  }
}

// GPT-2's sizes (Radford et al. 2019, as nanoGPT and llm.c build them); `tiny` is the default.
void apply_model_preset(const std::string& name, ModelConfig& m) {
  struct Preset {
    const char* name;
    int d_model, n_layer, n_head, seq_len;
  };
  static constexpr Preset kPresets[] = {
      {"tiny", 128, 4, 4, 128},
      {"gpt2-small", 768, 12, 12, 1024},
      {"gpt2-medium", 1024, 24, 16, 1024},
  };
  for (const auto& p : kPresets) {
    if (name != p.name) continue;
    m.d_model = p.d_model;
    m.n_layer = p.n_layer;
    m.n_head = p.n_head;
    m.seq_len = p.seq_len;
  }
}

void validate(const Config& c) {
  const auto& m = c.model;
  XLOCO_ENFORCE(m.d_model % m.n_head == 0, ConfigError,
                "config: model.n_head = {} must divide model.d_model = {}", m.n_head, m.d_model);
  const bool script = m.kind == ModelKind::kTorchScript;
  XLOCO_ENFORCE(!script || !m.path.empty(), ConfigError,
                "config: model.kind = torchscript needs model.path (a module saved by "
                "torch.jit.save; see examples/)");
  XLOCO_ENFORCE(script || m.path.empty(), ConfigError,
                "config: model.path is for model.kind = torchscript, got model.kind = {}",
                to_string(m.kind));
  if (c.data.dataset == DatasetKind::kKjv || c.data.dataset == DatasetKind::kTokens) {
    const char* name = to_string(c.data.dataset);
    XLOCO_ENFORCE(m.kind == ModelKind::kGpt || script, ConfigError,
                  "config: data.dataset = {} needs model.kind = gpt (or torchscript), got {}", name,
                  to_string(m.kind));
    XLOCO_ENFORCE(c.data.sharding == Sharding::kIid || c.data.sharding == Sharding::kBooks ||
                      c.data.sharding == Sharding::kContiguous,
                  ConfigError,
                  "config: data.sharding = {} is not valid for {}; allowed: iid, contiguous (or "
                  "books)", to_string(c.data.sharding), name);
    XLOCO_ENFORCE(c.data.dataset != DatasetKind::kTokens || !c.data.path.empty(), ConfigError,
                  "config: data.dataset = tokens needs data.path (the folder `xloco prepare` "
                  "wrote)");
  } else {
    XLOCO_ENFORCE(m.kind == ModelKind::kCnn || script, ConfigError,
                  "config: data.dataset = fmnist needs model.kind = cnn (or torchscript), got {}",
                  to_string(m.kind));
    XLOCO_ENFORCE(c.data.sharding == Sharding::kIid || c.data.sharding == Sharding::kDirichlet,
                  ConfigError,
                  "config: data.sharding = {} is not valid for fmnist; allowed: iid, dirichlet",
                  to_string(c.data.sharding));
  }
  XLOCO_ENFORCE(c.inner.min_lr <= c.inner.lr, ConfigError,
                "config: inner.min_lr = {:g} must not exceed inner.lr = {:g}", c.inner.min_lr,
                c.inner.lr);
  XLOCO_ENFORCE(c.inner.warmup_steps <= c.inner.steps, ConfigError,
                "config: inner.warmup_steps = {} must not exceed inner.steps = {}",
                c.inner.warmup_steps, c.inner.steps);
  XLOCO_ENFORCE(c.outer.min_providers <= c.outer.providers, ConfigError,
                "config: outer.min_providers = {} must not exceed outer.providers = {}",
                c.outer.min_providers, c.outer.providers);
  XLOCO_ENFORCE(c.outer.dead_after_s >= 2 * c.outer.heartbeat_s, ConfigError,
                "config: outer.dead_after_s = {:g} must be at least twice outer.heartbeat_s = {:g}",
                c.outer.dead_after_s, c.outer.heartbeat_s);
  XLOCO_ENFORCE(c.outer.downlink != Downlink::kRelay || c.outer.momentum == 0, ConfigError,
                "config: outer.downlink = \"relay\" applies outer SGD on every replica: "
                "outer.momentum must be 0 (it is {:g})",
                c.outer.momentum);
  XLOCO_ENFORCE(c.outer.relay_mean == RelayMean::kAll || c.outer.downlink == Downlink::kRelay,
                ConfigError,
                "config: outer.relay_mean = \"{}\" divides a relayed update: it needs "
                "outer.downlink = \"relay\" (it is \"{}\")",
                name_of(c.outer.relay_mean), name_of(c.outer.downlink));
  XLOCO_ENFORCE(c.outer.codec_up != CodecKind::kInt4 || c.outer.block_size % 2 == 0, ConfigError,
                "config: outer.block_size = {} must be even for int4", c.outer.block_size);
  if (c.outer.codec_up == CodecKind::kTopk || c.outer.codec_down == CodecKind::kTopk) {
    XLOCO_ENFORCE(c.outer.block_size <= (1 << 16), ConfigError,
                  "config: outer.block_size = {} is above 65536, the largest topk block",
                  c.outer.block_size);
    XLOCO_ENFORCE(c.outer.topk_down <= c.outer.block_size, ConfigError,
                  "config: outer.topk_down = {} exceeds outer.block_size = {}", c.outer.topk_down,
                  c.outer.block_size);
    XLOCO_ENFORCE(c.outer.topk <= c.outer.block_size, ConfigError,
                  "config: outer.topk = {} exceeds outer.block_size = {}", c.outer.topk,
                  c.outer.block_size);
  }
  XLOCO_ENFORCE(c.outer.topk_bits == 2 || c.outer.topk_bits == 4, ConfigError,
                "config: outer.topk_bits = {}: topk values are 2 or 4 bits", c.outer.topk_bits);
  XLOCO_ENFORCE(c.outer.topk_bits_down == 0 || c.outer.topk_bits_down == 2 ||
                    c.outer.topk_bits_down == 4,
                ConfigError,
                "config: outer.topk_bits_down = {}: topk values are 2 or 4 bits (0: as "
                "outer.topk_bits)",
                c.outer.topk_bits_down);
  XLOCO_ENFORCE(c.outer.delay_steps <= c.outer.inner_steps, ConfigError,
                "config: outer.delay_steps = {} exceeds outer.inner_steps = {} (the update of a "
                "round is folded in within the next one)", c.outer.delay_steps, c.outer.inner_steps);
  XLOCO_ENFORCE(c.outer.min_inner_steps <= c.outer.inner_steps, ConfigError,
                "config: outer.min_inner_steps = {} exceeds outer.inner_steps = {} (the most steps "
                "a round may take)", c.outer.min_inner_steps, c.outer.inner_steps);
  // Features meant to go together that were never measured together are refused until they
  // are (experiments/RESULTS.md, "Recipes": the sparse relay with overlap was measured).
  XLOCO_ENFORCE(c.outer.fragments == 1 || c.outer.downlink != Downlink::kRelay, ConfigError,
                "config: outer.fragments = {} with outer.downlink = \"relay\" has not been "
                "measured together; use one of them (recipe \"wan-sparse\" is relay with "
                "fragments 1)", c.outer.fragments);
  XLOCO_ENFORCE(c.outer.round_budget_s == 0 || !any_topk(c), ConfigError,
                "config: outer.round_budget_s = {:g} with a topk codec has not been measured "
                "together; use time budgets with int8 (recipe \"unequal\") or topk with fixed H "
                "(recipe \"wan-sparse\")", c.outer.round_budget_s);
  XLOCO_ENFORCE(c.outer.recipe != "unequal" || c.outer.round_budget_s > 0, ConfigError,
                "config: outer.recipe = \"unequal\" needs outer.round_budget_s: a little below the "
                "seconds your fast providers take for outer.inner_steps = {} steps (their step "
                "time is in `xloco status`; `xloco advise` helps)", c.outer.inner_steps);
  XLOCO_ENFORCE(!c.run.name.empty() && c.run.name.find('/') == std::string::npos, ConfigError,
                "config: run.name \"{}\" must be a non-empty name without '/'", c.run.name);
}

// The known key closest to `key` by edit distance (insertions, deletions, substitutions and
// swaps of neighbours), when it is within a third of the key's length; "" otherwise.
std::string nearest_key(const std::string& key, const std::set<std::string>& known) {
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (size_t k = 0; k <= b.size(); ++k) d[0][k] = k;
    for (size_t i = 1; i <= a.size(); ++i) {
      for (size_t k = 1; k <= b.size(); ++k) {
        d[i][k] = std::min({d[i - 1][k] + 1, d[i][k - 1] + 1,
                            d[i - 1][k - 1] + (a[i - 1] == b[k - 1] ? 0 : 1)});
        if (i > 1 && k > 1 && a[i - 1] == b[k - 2] && a[i - 2] == b[k - 1]) {
          d[i][k] = std::min(d[i][k], d[i - 2][k - 2] + 1);
        }
      }
    }
    return d[a.size()][b.size()];
  };
  if (key.size() > 200) return "";
  std::string best;
  size_t best_d = std::max<size_t>(2, key.size() / 3) + 1;
  for (const auto& k : known) {
    const size_t dk = distance(key, k);
    if (dk < best_d) {
      best_d = dk;
      best = k;
    }
  }
  return best;
}

// Refuses a key the user set (present in `user`, the file with its --set overrides) to a value
// other than its default where its row's `when` does not hold. A key a recipe set is not the
// user's: it is left alone.
void refuse_inert(const json& user, const Config& c) {
  const json resolved = to_json(c);
  const json defaults = to_json(Config{});
  Config probe = c;
  visit_fields(probe, [&](const Key& k, auto&, const auto&) {
    if (k.when == nullptr || find_dotted(user, k.name) == nullptr || k.when->holds(c)) return;
    const json* value = find_dotted(resolved, k.name);
    const json* fallback = find_dotted(defaults, k.name);
    if (value == nullptr || fallback == nullptr || *value == *fallback) return;
    const json* governing = find_dotted(resolved, k.when->governing);
    throw ConfigError(fmt::format(
        "config: {} = {} does nothing here: it applies only with {}, and {} is {}; remove it or "
        "set {}",
        k.name, json_dump(*value), k.when->text, k.when->governing,
        governing != nullptr ? json_dump(*governing) : std::string("unset"), k.when->governing));
  });
}

// The user's document over the recipe it names: the recipe's keys first, every key the user
// gave (beside it, in the file or by --set) wins.
json with_recipe(const json& j) {
  const json* name = find_dotted(j, "outer.recipe");
  const RecipeInfo* r =
      name != nullptr && name->is_string() ? find_recipe(name->get<std::string>()) : nullptr;
  if (r == nullptr) return j;  // none, or an unknown name: parse refuses it with the recipes' names
  json merged = json::object();
  for (const auto& set : r->sets) apply_override(merged, set);
  merged.merge_patch(j);
  return merged;
}

// data.path names a folder of token files (meta.json, or a *train*.bin) while data.dataset is
// left out or "kjv" (a config made for KJV, whose data.path is a text file: it cannot read a
// folder): the tokens data set, the only one such a folder can be. Any other case is left to
// the data sets' own errors.
void infer_dataset(json& j) {
  const json* path = find_dotted(j, "data.path");
  const json* dataset = find_dotted(j, "data.dataset");
  if (path == nullptr || !path->is_string()) return;
  if (dataset != nullptr && *dataset != "kjv") return;
  std::error_code ec;
  const std::filesystem::path dir = path->get<std::string>();
  if (!std::filesystem::is_directory(dir, ec)) return;
  bool tokens = std::filesystem::exists(dir / "meta.json", ec);
  for (std::filesystem::directory_iterator it(dir, ec), end; !tokens && !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    tokens = name.find("train") != std::string::npos && name.size() > 4 &&
             name.compare(name.size() - 4, 4, ".bin") == 0;
  }
  if (tokens) j["data"]["dataset"] = "tokens";
}

}  // namespace

Config parse_config(const json& user) {
  XLOCO_ENFORCE(user.is_object(), ConfigError, "config: top level must be a JSON object");
  for (const char* key : {"outer.codec_down", "outer.codec_up"}) {
    const json* v = find_dotted(user, key);
    XLOCO_ENFORCE(v == nullptr || *v != "relay", ConfigError,
                  "config: {} = \"relay\": relay is no longer a codec; set outer.downlink = "
                  "\"relay\" instead (the providers' frames are relayed as they were sent, and "
                  "outer.codec_down goes unused)", key);
  }
  const json j = with_recipe(user);
  Config c;
  // A preset sets its model fields first; fields given next to it are parsed after and win.
  if (const json* p = find_dotted(j, "model.preset"); p != nullptr && p->is_string()) {
    apply_model_preset(p->get<std::string>(), c.model);
  }
  std::set<std::string> known;
  visit_fields(c, [&](const Key& k, auto& field, const auto& allowed) {
    known.insert(k.name);
    if (const json* v = find_dotted(j, k.name)) set_field(k.name, *v, field, allowed);
  });
  std::vector<std::string> leaves;
  collect_leaves(j, "", leaves);
  for (const auto& leaf : leaves) {
    if (known.count(leaf)) continue;
    const std::string section = leaf.substr(0, leaf.find('.'));
    std::vector<std::string> siblings;
    for (const auto& k : known) {
      if (k.rfind(section + ".", 0) == 0) siblings.push_back(k);
    }
    const std::string nearest = nearest_key(leaf, known);
    throw ConfigError(fmt::format("config: unknown key \"{}\"{}{}", printable(leaf),
                                  nearest.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", nearest),
                                  siblings.empty()
                                      ? std::string("; sections: run, data, model, inner, outer")
                                      : fmt::format("; known keys: {}", fmt::join(siblings, ", "))));
  }
  try {
    validate(c);
  } catch (const ConfigError& e) {
    if (c.outer.recipe.empty()) throw;
    // A key given beside a recipe wins over it: say which keys the recipe set, and which of
    // them the user's document overrode.
    std::vector<std::string> overridden;
    for (const auto& set : find_recipe(c.outer.recipe)->sets) {  // parsed: a known name
      const std::string key = set.substr(0, set.find('='));
      if (find_dotted(user, key) != nullptr) overridden.push_back(key);
    }
    throw ConfigError(fmt::format(
        "{}; outer.recipe = \"{}\" sets its own keys first and a key given beside it wins{}",
        e.what(), c.outer.recipe,
        overridden.empty() ? std::string()
                           : fmt::format(" (given here: {})", fmt::join(overridden, ", "))));
  }
  return c;
}

std::pair<size_t, size_t> line_and_column(const std::string& text, size_t byte) {
  // nlohmann counts `byte` from 1 (the character it stopped at); 0 when nothing was read.
  const size_t end = std::min(text.size(), byte > 0 ? byte - 1 : 0);
  size_t line = 1, column = 1;
  for (size_t i = 0; i < end; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

namespace {

// nlohmann's parse error without its "[json.exception.parse_error.101] parse error at line L,
// column C: " prefix (the caller names the place), made printable.
std::string json_error_text(const std::string& what) {
  std::string s = what;
  if (const auto colon = s.find(": "); s.rfind("[json.exception", 0) == 0 && colon != std::string::npos) {
    s = s.substr(colon + 2);
  }
  return printable(s, 300);
}

}  // namespace

void apply_override(json& j, const std::string& assignment) {
  const auto eq = assignment.find('=');
  XLOCO_ENFORCE(eq != std::string::npos && eq > 0, ConfigError,
                "--set \"{}\": expected key=value, e.g. inner.lr=3e-4", assignment);
  const std::string key = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) value = text;
  json* cur = &j;
  std::stringstream ss(key);
  std::string part;
  std::vector<std::string> parts;
  while (std::getline(ss, part, '.')) parts.push_back(part);
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    json& next = (*cur)[parts[i]];
    if (next.is_null()) next = json::object();
    XLOCO_ENFORCE(next.is_object(), ConfigError, "--set {}: {} is not a section", key, parts[i]);
    cur = &next;
  }
  (*cur)[parts.back()] = value;
}

namespace {

// The config file as JSON (comments allowed); a syntax error names FILE:LINE:COLUMN.
json read_config_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  XLOCO_ENFORCE(in.good(), ConfigError, "config: cannot open {}", path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    return json::parse(text, nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    const auto [line, column] = line_and_column(text, e.byte);
    throw ConfigError(fmt::format("config: {}:{}:{}: not valid JSON: {}", path, line, column,
                                  json_error_text(e.what())));
  }
}

// The recipe a --set names (the last one), or nullptr. A recipe chosen on the command line is
// the newer choice: its keys go over the file's, and the other --set keys over it; a recipe in
// the file sits under the file's own keys (with_recipe).
const RecipeInfo* recipe_set(const std::vector<std::string>& overrides) {
  json set = json::object();
  for (const auto& o : overrides) apply_override(set, o);
  const json* name = find_dotted(set, "outer.recipe");
  return name != nullptr && name->is_string() ? find_recipe(name->get<std::string>()) : nullptr;
}

// The file, the recipe given by --set (if any) over it, then every --set.
json merge_document(const json& file, const std::vector<std::string>& overrides) {
  json j = file;
  if (const RecipeInfo* r = recipe_set(overrides); r != nullptr && j.is_object()) {
    for (const auto& set : r->sets) apply_override(j, set);
  }
  for (const auto& o : overrides) apply_override(j, o);
  return j;
}

}  // namespace

Config parse_stored_config(json j) {
  if (j.is_object() && j.contains("outer") && j["outer"].is_object() &&
      j["outer"].value("codec_down", json()) == "relay") {
    j["outer"].erase("codec_down");
    j["outer"]["downlink"] = "relay";
  }
  return parse_config(j);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  json j = merge_document(read_config_file(path), overrides);
  infer_dataset(j);
  try {
    Config c = parse_config(j);
    refuse_inert(j, c);
    return c;
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("{} (in {})", e.what(), path));
  }
}

json to_json(const Config& c_in) {
  Config c = c_in;
  json j = json::object();
  visit_fields(c, [&](const Key& k, auto& field, const auto&) {
    json* cur = &j;
    std::stringstream ss(k.name);
    std::string part;
    std::vector<std::string> parts;
    while (std::getline(ss, part, '.')) parts.push_back(part);
    for (size_t i = 0; i + 1 < parts.size(); ++i) cur = &(*cur)[parts[i]];
    if constexpr (std::is_enum_v<std::decay_t<decltype(field)>>) {
      (*cur)[parts.back()] = name_of(field);
    } else {
      (*cur)[parts.back()] = field;
    }
  });
  return j;
}

std::string to_json_string(const Config& c) { return json_dump(to_json(c), 2); }

const char* to_string(DatasetKind kind) { return name_of(kind); }
const char* to_string(Sharding sharding) { return name_of(sharding); }
const char* to_string(ModelKind kind) { return name_of(kind); }
const char* to_string(CodecKind kind) { return name_of(kind); }
const char* to_string(Downlink downlink) { return name_of(downlink); }
const char* to_string(Kernels kernels) { return name_of(kernels); }
const char* to_string(Precision precision) { return name_of(precision); }
const char* to_string(Overlap overlap) { return name_of(overlap); }
const char* to_string(Fold fold) { return name_of(fold); }
const char* to_string(RelayMean mean) { return name_of(mean); }

void check_diloco_schedule(const Config& c) {
  XLOCO_ENFORCE(c.outer.inner_steps <= c.inner.steps, ConfigError,
                "config: outer.inner_steps = {} exceeds inner.steps = {}: the run would be one "
                "round of {} steps, not rounds of H = {}; lower outer.inner_steps or raise "
                "inner.steps",
                c.outer.inner_steps, c.inner.steps, c.inner.steps, c.outer.inner_steps);
}

int total_rounds(const Config& c) {
  return (c.inner.steps + c.outer.inner_steps - 1) / c.outer.inner_steps;
}

const std::vector<RecipeInfo>& recipes() { return kRecipes; }

namespace {

// Whether config_hash takes key `k` of `c` (whose value is `value`, its default `fallback`).
bool hashed(const Key& k, const Config& c, const json& value, const json& fallback) {
  if (k.scope != Scope::kAgreed) return false;
  switch (k.hash) {
    case Hash::kAlways:
      return true;
    case Hash::kUnlessDefault:
      return k.off != nullptr ? !k.off(c) : value != fallback;
    case Hash::kWhenApplies:
      return k.when == nullptr || k.when->holds(c);
  }
  return true;
}

}  // namespace

std::string config_hash(const Config& c) {
  // Walks the field table: the agreed keys, by their rows' rules. Two places differ from a
  // key's own name, as they always have: run.seed is hashed as "seed" (nothing else of run is),
  // and a TorchScript module's bytes as model.module_blake2b (its path is each machine's own).
  const json values = to_json(c);
  const json defaults = to_json(Config{});
  json j = json::object();
  Config probe = c;
  visit_fields(probe, [&](const Key& k, auto&, const auto&) {
    const json& value = *find_dotted(values, k.name);
    if (!hashed(k, c, value, *find_dotted(defaults, k.name))) return;
    const std::string name = k.name;
    const auto dot = name.find('.');
    if (name == "run.seed") {
      j["seed"] = value;
    } else {
      j[name.substr(0, dot)][name.substr(dot + 1)] = value;
    }
  });
  if (!c.model.file_hash.empty()) j["model"]["module_blake2b"] = c.model.file_hash;
  // outer.downlink "relay" hashes as outer.codec_down "relay" did before it was a key of its
  // own, so that relay runs' checkpoints resume.
  if (c.outer.downlink == Downlink::kRelay) j["outer"]["codec_down"] = "relay";
  const std::string text = json_dump(j);
  return hash_hex(text.data(), text.size());
}

std::vector<KeyExplained> explain_config(const std::string& path,
                                         const std::vector<std::string>& overrides,
                                         const Config& resolved) {
  const json file = read_config_file(path);
  json set = json::object();
  for (const auto& o : overrides) apply_override(set, o);
  const json merged = merge_document(file.is_object() ? file : json::object(), overrides);
  const bool recipe_by_set = recipe_set(overrides) != nullptr;
  ModelConfig preset;
  const json* preset_name = find_dotted(merged, "model.preset");
  const bool has_preset = preset_name != nullptr && preset_name->is_string();
  if (has_preset) apply_model_preset(preset_name->get<std::string>(), preset);
  const json preset_json = to_json([&] {
    Config c;
    c.model = preset;
    return c;
  }());
  const json defaults = to_json(Config{});
  const json values = to_json(resolved);
  const json recipe = with_recipe(json{{"outer", {{"recipe", resolved.outer.recipe}}}});
  std::vector<KeyExplained> out;
  Config probe = resolved;
  visit_fields(probe, [&](const Key& row, auto&, const auto&) {
    const std::string key = row.name;
    KeyExplained k;
    k.key = key;
    k.scope = kScopeNames[static_cast<int>(row.scope)];
    const json* v = find_dotted(values, key);
    k.value = v != nullptr ? json_dump(*v) : "null";
    if (find_dotted(set, key) != nullptr) {
      k.source = "--set";
    } else if (recipe_by_set && key != "outer.recipe" && find_dotted(recipe, key) != nullptr) {
      k.source = "recipe";
    } else if (file.is_object() && find_dotted(file, key) != nullptr) {
      k.source = "file";
    } else if (key != "outer.recipe" && find_dotted(recipe, key) != nullptr) {
      k.source = "recipe";
    } else if (has_preset && key.rfind("model.", 0) == 0 &&
               *find_dotted(preset_json, key) != *find_dotted(defaults, key)) {
      k.source = "preset";
    } else if (v != nullptr && *v != *find_dotted(defaults, key)) {
      k.source = "derived";  // from the data or the module (model.vocab_size from meta.json)
    } else {
      k.source = "default";
    }
    if (row.when != nullptr && !row.when->holds(resolved)) {
      k.inert = fmt::format("inert: applies only with {}", row.when->text);
    }
    out.push_back(std::move(k));
  });
  return out;
}

}  // namespace xloco::common
