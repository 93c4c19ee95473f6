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
template <> constexpr std::array kNames<CodecKind>{"fp32", "bf16", "int8", "int4", "topk", "relay"};
template <> constexpr std::array kNames<Kernels>{"fused", "aten"};
template <> constexpr std::array kNames<Overlap>{"none", "delayed"};
template <> constexpr std::array kNames<Fold>{"step", "arrival"};
template <> constexpr std::array kNames<RelayMean>{"all", "present", "clipped"};

template <class E>
const char* name_of(E e) {
  return kNames<E>.at(static_cast<size_t>(e));
}

// Every config field, once: name, reference, allowed values. parse/dump/unknown-key checks all
// walk this table, so a new field is one line here plus one in config.h.
template <class Visitor>
void visit_fields(Config& c, Visitor&& v) {
  v("run.name", c.run.name, Choices{});
  v("run.dir", c.run.dir, Choices{});
  v("run.seed", c.run.seed, Range{0, 9.0e15});
  v("run.device", c.run.device, Choices{});
  v("run.threads", c.run.threads, Range{0, 1024});
  v("run.blas_threads", c.run.blas_threads, Range{0, 1024});
  v("run.kernels", c.run.kernels, Named{});
  v("data.dataset", c.data.dataset, Named{});
  v("data.sharding", c.data.sharding, Named{});
  v("data.dirichlet_alpha", c.data.dirichlet_alpha, Range{1e-3, 1e6});
  v("data.path", c.data.path, Choices{});
  v("data.cache_dir", c.data.cache_dir, Choices{});
  v("model.kind", c.model.kind, Named{});
  v("model.path", c.model.path, Choices{});
  v("model.preset", c.model.preset, Choices{"", "tiny", "gpt2-small", "gpt2-medium"});
  v("model.vocab_size", c.model.vocab_size, Range{0, 1 << 24});
  v("model.d_model", c.model.d_model, Range{8, 65536});
  v("model.n_layer", c.model.n_layer, Range{1, 1024});
  v("model.n_head", c.model.n_head, Range{1, 1024});
  v("model.seq_len", c.model.seq_len, Range{2, 1 << 20});
  v("inner.lr", c.inner.lr, Range{0, 10});
  v("inner.min_lr", c.inner.min_lr, Range{0, 10});
  v("inner.warmup_steps", c.inner.warmup_steps, Range{0, 1e9});
  v("inner.steps", c.inner.steps, Range{1, 1e9});
  v("inner.batch_size", c.inner.batch_size, Range{1, 1 << 20});
  v("inner.weight_decay", c.inner.weight_decay, Range{0, 10});
  v("inner.beta1", c.inner.beta1, Range{0, 0.999999});
  v("inner.beta2", c.inner.beta2, Range{0, 0.999999});
  v("inner.eps", c.inner.eps, Range{1e-12, 1});
  v("inner.grad_clip", c.inner.grad_clip, Range{0, 1e6});
  v("inner.eval_every", c.inner.eval_every, Range{0, 1e9});
  v("inner.eval_batches", c.inner.eval_batches, Range{1, 1e6});
  v("inner.log_every", c.inner.log_every, Range{1, 1e9});
  v("inner.checkpoint_every", c.inner.checkpoint_every, Range{0, 1e9});
  v("inner.bucket_kb", c.inner.bucket_kb, Range{4, 1 << 22});
  v("outer.inner_steps", c.outer.inner_steps, Range{1, 1e9});
  v("outer.lr", c.outer.lr, Range{0, 100});
  v("outer.lr_end", c.outer.lr_end, Range{-1, 100});
  v("outer.momentum", c.outer.momentum, Range{0, 0.999999});
  v("outer.nesterov", c.outer.nesterov, Flag{});
  v("outer.codec_up", c.outer.codec_up, Named{});
  v("outer.codec_down", c.outer.codec_down, Named{});
  v("outer.relay_mean", c.outer.relay_mean, Named{});
  v("outer.relay_clip", c.outer.relay_clip, Range{0, 1e6});
  v("outer.block_size", c.outer.block_size, Range{2, 1 << 20});
  v("outer.topk", c.outer.topk, Range{0, 1 << 16});
  v("outer.topk_down", c.outer.topk_down, Range{0, 1 << 16});
  v("outer.topk_bits", c.outer.topk_bits, Range{2, 4});
  v("outer.topk_bits_down", c.outer.topk_bits_down, Range{0, 4});
  v("outer.ef_decay", c.outer.ef_decay, Range{0, 1});
  v("outer.zstd_level", c.outer.zstd_level, Range{0, 19});
  v("outer.providers", c.outer.providers, Range{1, 4096});
  v("outer.min_providers", c.outer.min_providers, Range{1, 4096});
  v("outer.checkpoint_every", c.outer.checkpoint_every, Range{0, 1e9});
  v("outer.keep_checkpoints", c.outer.keep_checkpoints, Range{1, 1e6});
  v("outer.eval_every", c.outer.eval_every, Range{0, 1e9});
  v("outer.round_timeout_s", c.outer.round_timeout_s, Range{1, 1e7});
  v("outer.deadline_multiple", c.outer.deadline_multiple, Range{1, 1000});
  v("outer.deadline_min_s", c.outer.deadline_min_s, Range{0.1, 1e7});
  v("outer.start_grace_s", c.outer.start_grace_s, Range{0, 1e7});
  v("outer.heartbeat_s", c.outer.heartbeat_s, Range{0.05, 3600});
  v("outer.dead_after_s", c.outer.dead_after_s, Range{0.2, 1e7});
  v("outer.hello_interval_s", c.outer.hello_interval_s, Range{0, 1e6});
  v("outer.norm_bound", c.outer.norm_bound, Range{0, 1e12});
  v("outer.norm_clip", c.outer.norm_clip, Flag{});
  v("outer.trust_region", c.outer.trust_region, Range{0, 1e6});
  v("outer.score", c.outer.score, Flag{});
  v("outer.score_batches", c.outer.score_batches, Range{1, 1e6});
  v("outer.score_margin", c.outer.score_margin, Range{-1e6, 1e6});
  v("outer.score_relative", c.outer.score_relative, Range{0, 1});
  v("outer.head_timeout_s", c.outer.head_timeout_s, Range{1, 1e7});
  v("outer.shared_data", c.outer.shared_data, Flag{});
  v("outer.overlap", c.outer.overlap, Named{});
  v("outer.delay_steps", c.outer.delay_steps, Range{0, 1e9});
  v("outer.fold", c.outer.fold, Named{});
  v("outer.keep_local", c.outer.keep_local, Range{0, 0.99});
  v("outer.fragments", c.outer.fragments, Range{1, 1e6});
  v("outer.round_budget_s", c.outer.round_budget_s, Range{0, 1e7});
  v("outer.min_inner_steps", c.outer.min_inner_steps, Range{1, 1e9});
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
  XLOCO_ENFORCE(c.outer.codec_up != CodecKind::kRelay, ConfigError,
                "config: outer.codec_up = \"relay\": relay is a downlink only (it sends the "
                "uplink's own frames); pick the uplink's codec");
  XLOCO_ENFORCE(c.outer.codec_down != CodecKind::kRelay || c.outer.momentum == 0, ConfigError,
                "config: outer.codec_down = \"relay\" applies outer SGD on every replica: "
                "outer.momentum must be 0 (it is {:g})",
                c.outer.momentum);
  XLOCO_ENFORCE(c.outer.relay_mean == RelayMean::kAll || c.outer.codec_down == CodecKind::kRelay,
                ConfigError,
                "config: outer.relay_mean = \"{}\" divides a relayed update: it needs "
                "outer.codec_down = \"relay\" (it is \"{}\")",
                name_of(c.outer.relay_mean), name_of(c.outer.codec_down));
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

// Keys that do something only when another key has a certain value (issue 53): set to anything
// but their default where they do nothing, they are refused naming the key that governs them.
struct InertRule {
  const char* key;
  const char* governing;  // the key that decides whether `key` applies
  const char* applies;    // when it applies, in words
  bool (*applies_to)(const Config&);
};

constexpr InertRule kInertRules[] = {
    {"outer.delay_steps", "outer.overlap", "outer.overlap = \"delayed\"",
     [](const Config& c) { return c.outer.overlap != Overlap::kNone; }},
    {"outer.fold", "outer.overlap", "outer.overlap = \"delayed\"",
     [](const Config& c) { return c.outer.overlap != Overlap::kNone; }},
    {"outer.topk", "outer.codec_up", "a topk codec (outer.codec_up or outer.codec_down = \"topk\")",
     [](const Config& c) { return c.outer.codec_up == CodecKind::kTopk || c.outer.codec_down == CodecKind::kTopk; }},
    {"outer.topk_bits", "outer.codec_up", "a topk codec (outer.codec_up or outer.codec_down = \"topk\")",
     [](const Config& c) { return c.outer.codec_up == CodecKind::kTopk || c.outer.codec_down == CodecKind::kTopk; }},
    {"outer.topk_down", "outer.codec_down", "outer.codec_down = \"topk\"",
     [](const Config& c) { return c.outer.codec_down == CodecKind::kTopk; }},
    {"outer.topk_bits_down", "outer.codec_down", "outer.codec_down = \"topk\"",
     [](const Config& c) { return c.outer.codec_down == CodecKind::kTopk; }},
    {"outer.relay_clip", "outer.relay_mean", "outer.relay_mean = \"clipped\"",
     [](const Config& c) { return c.outer.relay_mean == RelayMean::kClipped; }},
    {"outer.min_inner_steps", "outer.round_budget_s", "a time budget (outer.round_budget_s > 0)",
     [](const Config& c) { return c.outer.round_budget_s > 0; }},
    {"data.dirichlet_alpha", "data.sharding", "data.sharding = \"dirichlet\"",
     [](const Config& c) { return c.data.sharding == Sharding::kDirichlet; }},
};

// Refuses a key the user set (present in `user`, the file with its --set overrides) to a value
// other than its default where its rule says it does nothing.
void refuse_inert(const json& user, const Config& c) {
  const json resolved = to_json(c);
  const json defaults = to_json(Config{});
  for (const auto& rule : kInertRules) {
    if (find_dotted(user, rule.key) == nullptr || rule.applies_to(c)) continue;
    const json* value = find_dotted(resolved, rule.key);
    const json* fallback = find_dotted(defaults, rule.key);
    if (value == nullptr || fallback == nullptr || *value == *fallback) continue;
    const json* governing = find_dotted(resolved, rule.governing);
    throw ConfigError(fmt::format(
        "config: {} = {} does nothing here: it applies only with {}, and {} is {}; remove it or "
        "set {}",
        rule.key, json_dump(*value), rule.applies, rule.governing,
        governing != nullptr ? json_dump(*governing) : std::string("unset"), rule.governing));
  }
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

Config parse_config(const json& j) {
  XLOCO_ENFORCE(j.is_object(), ConfigError, "config: top level must be a JSON object");
  Config c;
  // A preset sets its model fields first; fields given next to it are parsed after and win.
  if (const json* p = find_dotted(j, "model.preset"); p != nullptr && p->is_string()) {
    apply_model_preset(p->get<std::string>(), c.model);
  }
  std::set<std::string> known;
  visit_fields(c, [&](const std::string& key, auto& field, const auto& allowed) {
    known.insert(key);
    if (const json* v = find_dotted(j, key)) set_field(key, *v, field, allowed);
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
  validate(c);
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

}  // namespace

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  json j = read_config_file(path);
  for (const auto& o : overrides) apply_override(j, o);
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
  visit_fields(c, [&](const std::string& key, auto& field, const auto&) {
    json* cur = &j;
    std::stringstream ss(key);
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
const char* to_string(Kernels kernels) { return name_of(kernels); }
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

std::string config_hash(const Config& c) {
  json j = to_json(c);
  j.erase("run");
  j["seed"] = c.run.seed;
  j["data"].erase("path");
  j["data"].erase("cache_dir");
  j["model"].erase("path");  // where the module lies differs between machines; its bytes count
  if (!c.model.file_hash.empty()) j["model"]["module_blake2b"] = c.model.file_hash;
  j["model"].erase("preset");  // the fields it set are hashed themselves
  // A byte-level run hashes as it did before model.vocab_size existed, so that its checkpoints
  // and saved provider states still resume after an upgrade.
  if (c.model.vocab_size == 0 || (c.data.dataset == DatasetKind::kKjv && c.model.vocab_size == 256)) {
    j["model"].erase("vocab_size");
  }
  // How a provider overlaps its rounds is its own business (the head's rules are the same
  // either way), so providers need not agree on it. Runs from before time budgets existed
  // hash as they did (their checkpoints and saved provider states still resume).
  j["outer"].erase("overlap");
  j["outer"].erase("delay_steps");
  j["outer"].erase("fold");
  if (c.outer.topk_down == 0) j["outer"].erase("topk_down");  // runs from before it hash as before
  if (c.outer.topk_bits == 2) j["outer"].erase("topk_bits");   // likewise
  if (c.outer.topk_bits_down == 0) j["outer"].erase("topk_bits_down");  // likewise
  // (likewise; compared as the encoder's float, so a β that rounds to 1 hashes as 1)
  if (static_cast<float>(c.outer.ef_decay) == 1.0f) j["outer"].erase("ef_decay");
  if (c.outer.keep_local == 0) j["outer"].erase("keep_local");  // likewise
  if (c.outer.lr_end < 0) j["outer"].erase("lr_end");            // likewise
  if (c.outer.relay_mean == RelayMean::kAll) j["outer"].erase("relay_mean");  // likewise
  if (c.outer.relay_mean != RelayMean::kClipped) j["outer"].erase("relay_clip");  // unused
  if (c.outer.fragments == 1) j["outer"].erase("fragments");    // likewise; others must agree
  if (c.outer.round_budget_s == 0) {
    j["outer"].erase("round_budget_s");
    j["outer"].erase("min_inner_steps");
  }
  j["inner"].erase("bucket_kb");
  j["inner"].erase("log_every");
  j["inner"].erase("checkpoint_every");
  j["outer"].erase("checkpoint_every");
  j["outer"].erase("keep_checkpoints");
  for (const char* timing : {"round_timeout_s", "deadline_multiple", "deadline_min_s",
                             "start_grace_s", "heartbeat_s", "dead_after_s", "head_timeout_s",
                             "hello_interval_s", "norm_bound", "norm_clip", "score",
                             "score_batches", "score_margin", "score_relative",
                             "providers", "min_providers"}) {
    j["outer"].erase(timing);  // the head's business: providers need not agree on them
  }
  const std::string text = json_dump(j);
  return hash_hex(text.data(), text.size());
}

std::vector<KeyExplained> explain_config(const std::string& path,
                                         const std::vector<std::string>& overrides,
                                         const Config& resolved) {
  const json file = read_config_file(path);
  json set = json::object();
  for (const auto& o : overrides) apply_override(set, o);
  json merged = file.is_object() ? file : json::object();
  for (const auto& o : overrides) apply_override(merged, o);
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
  std::vector<KeyExplained> out;
  Config probe = resolved;
  visit_fields(probe, [&](const std::string& key, auto&, const auto&) {
    KeyExplained k;
    k.key = key;
    const json* v = find_dotted(values, key);
    k.value = v != nullptr ? json_dump(*v) : "null";
    if (find_dotted(set, key) != nullptr) {
      k.source = "--set";
    } else if (file.is_object() && find_dotted(file, key) != nullptr) {
      k.source = "file";
    } else if (has_preset && key.rfind("model.", 0) == 0 &&
               *find_dotted(preset_json, key) != *find_dotted(defaults, key)) {
      k.source = "preset";
    } else if (v != nullptr && *v != *find_dotted(defaults, key)) {
      k.source = "derived";  // from the data or the module (model.vocab_size from meta.json)
    } else {
      k.source = "default";
    }
    for (const auto& rule : kInertRules) {
      if (key == rule.key && !rule.applies_to(resolved)) {
        k.inert = fmt::format("inert: applies only with {}", rule.applies);
      }
    }
    out.push_back(std::move(k));
  });
  return out;
}

}  // namespace xloco::common
