// The run configuration: plain structs with defaults, parsed from JSON and validated in one
// place (config.cpp). Modules take these typed structs, never raw JSON. One field table drives
// parsing, range checks, unknown-key rejection, `--set a.b=v` overrides and the JSON dump.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace xloco::common {

// The kinds a config chooses between, parsed from their names once at load; to_string gives
// the name back (as written in JSON configs and in config.json).
enum class DatasetKind { kKjv, kFmnist, kTokens };
enum class Sharding { kIid, kBooks, kDirichlet, kContiguous };
enum class ModelKind { kGpt, kCnn, kTorchScript };
enum class CodecKind { kFp32, kBf16, kInt8, kInt4, kTopk };
// How a round's update reaches the providers (outer/round/downlink.h): requantized by
// outer.codec_down, or the round's accepted uplink frames themselves (outer/round/relay.h).
enum class Downlink { kQuantized, kRelay };
enum class Kernels { kFused, kAten };
enum class Precision { kFp32, kBf16 };
enum class Overlap { kNone, kDelayed };
enum class Fold { kStep, kArrival };
enum class RelayMean { kAll, kPresent, kClipped };
const char* to_string(DatasetKind kind);
const char* to_string(Sharding sharding);
const char* to_string(ModelKind kind);
const char* to_string(CodecKind kind);
const char* to_string(Downlink downlink);
const char* to_string(Kernels kernels);
const char* to_string(Precision precision);
const char* to_string(Overlap overlap);
const char* to_string(Fold fold);
const char* to_string(RelayMean mean);

struct RunConfig {
  std::string name = "run";    // run directory name under dir
  std::string dir = "runs";    // parent of run directories
  uint64_t seed = 1337;        // model init and data order
  std::string device = "auto"; // auto (CUDA when present) | cpu | cuda | cuda:N
  int threads = 0;             // intra-op threads per rank; 0 = 1 (measured, RESULTS.md)
  int blas_threads = 0;        // OpenBLAS threads per rank; 0 = cores / ranks on this host
  Kernels kernels = Kernels::kFused;  // CPU GPT kernels: fused (src/inner/kernels.h) | aten
                                      // (LibTorch's ops); the same model, different rounding
  // fp32 | bf16: the inner step's forward under autocast (bf16 products; weights, gradients,
  // AdamW state, the pseudo-gradient, codecs and θ_pub stay fp32); eval runs in fp32
  Precision precision = Precision::kFp32;
};

struct DataConfig {
  // kjv | fmnist | tokens (llm.c token files); left out or kjv while data.path is a folder of
  // token files (meta.json or *train*.bin), load_config takes tokens
  DatasetKind dataset = DatasetKind::kKjv;
  Sharding sharding = Sharding::kIid;       // kjv, tokens: iid | contiguous (= books); fmnist: iid | dirichlet
  double dirichlet_alpha = 0.5;  // label skew for fmnist dirichlet sharding
  std::string path = "";         // fmnist: IDX folder; kjv: text file ("" = from `bible`);
                                 // tokens: the folder `xloco prepare` wrote (or llm.c shards)
  std::string cache_dir = "";    // where the KJV text is cached ("" = $XDG_CACHE_HOME/xloco)
};

struct ModelConfig {
  ModelKind kind = ModelKind::kGpt;  // gpt | cnn | torchscript
  std::string path = "";     // torchscript: the scripted module (torch.jit.save) to train
  std::string file_hash = "";  // torchscript: BLAKE2b of `path`, filled by load_run_config (not
                               // a config field); the config hash covers it
  std::string preset = "";   // gpt: tiny | gpt2-small | gpt2-medium sets the fields below;
                             // a field given next to it still wins
  int vocab_size = 0;        // gpt: 0 = from the data (kjv: 256 bytes; tokens: meta.json);
                             // larger pads the embedding (e.g. to a multiple of 64)
  int d_model = 128;         // gpt embedding width
  int n_layer = 4;           // gpt blocks
  int n_head = 4;            // gpt attention heads (divides d_model)
  int seq_len = 128;         // gpt context length (tokens)
};

struct InnerConfig {
  double lr = 1e-3;          // peak AdamW learning rate
  double min_lr = 1e-4;      // end of the cosine decay
  int warmup_steps = 100;    // linear warm-up from 0
  int steps = 1000;          // total inner steps of the schedule
  int batch_size = 32;       // per provider (split over its ranks)
  double weight_decay = 0.1; // on >=2-D weights only
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;    // global grad-norm clip; 0 = off
  int eval_every = 200;      // steps between evals; 0 = only at the end
  int eval_batches = 8;      // validation batches per eval
  int log_every = 10;        // steps between progress lines / metrics
  int checkpoint_every = 0;  // steps between checkpoints; 0 = only at the end
  int bucket_kb = 4096;      // gradient allreduce bucket size
};

struct OuterConfig {
  int inner_steps = 50;          // H: inner steps per round (rounds = ceil(inner.steps / H))
  double lr = 0.7;               // outer SGD learning rate
  double lr_end = -1;            // ≥ 0: the outer lr falls linearly from outer.lr to this at the
                                 // last round (round r of R: lr + (lr_end − lr)·r/R); < 0: constant
  double momentum = 0.9;         // outer momentum
  bool nesterov = true;          // Nesterov momentum (DiLoCo)
  CodecKind codec_up = CodecKind::kInt8;    // provider -> head pseudo-gradient: fp32 | bf16 | int8 | int4 | topk
  // "quantized": θ_true − θ_pub requantized by codec_down; "relay": the round's accepted uplink
  // frames themselves, applied alike on every replica (outer/round/relay.h; outer SGD only).
  Downlink downlink = Downlink::kQuantized;
  CodecKind codec_down = CodecKind::kInt8;  // head -> provider update (downlink "quantized")
  // With downlink "relay", what each element of the relayed sum is divided by. "all": the
  // weight of every frame (the plain mean: an element one provider of K sent moves by lr/K of
  // its value). "present": the weight of the frames whose value there is not zero (a sparse
  // uplink's elements move by lr × the mean of those who sent them). "clipped": the weight of
  // every frame, with each frame that did not send an element credited there with the
  // senders' mean clipped to relay_clip × the smallest magnitude it sent in that block (what
  // it can have held back there); between "all" (relay_clip 0) and "present" (relay_clip ∞).
  RelayMean relay_mean = RelayMean::kAll;
  double relay_clip = 2;         // relay_mean "clipped": the multiple of a frame's least sent value
  int block_size = 256;          // quantization block (int8, int4), or top-k chunk (topk, ≤ 65536)
  int topk = 0;                  // topk: values sent per block; 0 = block_size / 64 (at least 1)
  int topk_down = 0;             // topk on the downlink: values per block; 0 = as outer.topk. The
                                 // head's update carries the sum of K sparse contributions, so
                                 // up to K times as many values move per round as one sends.
  int topk_bits = 2;             // topk: bits per value sent, 2 (±s, ±2s) or 4 (±s … ±8s)
  int topk_bits_down = 0;        // the same on the downlink; 0 = as outer.topk_bits
  double ef_decay = 1.0;         // uplink error feedback: e ← ef_decay · e + Δ at each round
                                 // (SparseLoCo's β, for topk); 1 keeps every unsent value
  int zstd_level = 1;            // 0 = store raw
  int providers = 1;             // K: providers the head waits for before round 1 (and shards)
  int min_providers = 1;         // a round may close with this many contributions
  int checkpoint_every = 5;      // rounds between head checkpoints (and on SIGINT/SIGTERM)
  int keep_checkpoints = 3;      // newest head checkpoints kept
  int eval_every = 1;            // rounds between evals of theta_pub on the head; 0 = end only
  double round_timeout_s = 3600; // longest a round may run (the deadline before any is measured)
  double deadline_multiple = 3;  // a round's deadline: this × the median round time of its providers
  double deadline_min_s = 30;    // ... but never less than this
  double start_grace_s = 120;    // round 1 waits this long for all K providers, then min_providers
  double heartbeat_s = 2;        // heartbeat period, both ways
  double dead_after_s = 20;      // a provider silent this long is dead (its round goes on without it)
  double hello_interval_s = 5;   // a member's HELLO this soon after its admission is ignored
  double norm_bound = 10;        // a contribution whose norm exceeds this × the median of its
                                 // peers' (one norm per provider) is refused; 0 = off
  bool norm_clip = true;         // each accepted contribution over that median is scaled down to
                                 // it, and one under median / norm_bound refused (aggregate.h)
  double trust_region = 0;       // a round moves a trained tensor by at most this × its norm
                                 // (+ inner.lr × inner_steps per element); 0 = off (opt-in:
                                 // at 1 it bound an honest 1-provider H=4 run's zero biases)
  // Contribution scoring (off by default; its cost is a forward pass over score_batches batches
  // per contribution, on the head): each contribution the norm rule accepts is applied alone to
  // θ at the outer rate and the loss on score_batches validation batches measured; one that
  // raises it by more than score_margin is refused (low_score). With score_relative > 0, one
  // that lowers the loss by less than score_relative × the round's median change (when that
  // median is a fall, over 3 or more contributions scored together) is refused too: a
  // contribution that helps far less than its peers' does not weigh as much as theirs.
  bool score = false;
  int score_batches = 2;
  double score_margin = 0;
  double score_relative = 0.5;
  double head_timeout_s = 3600;  // a provider gives up when the head is silent this long
  bool shared_data = false;      // every provider gets the whole data set (replica tests)
  // "none": a provider waits for round r's update before training round r + 1. "delayed": it
  // trains round r + 1 at once from its own parameters and folds round r's update in after
  // delay_steps of them (θ ← θ_pub(r) + θ − base): it waits for the downlink only when the
  // update takes longer than those steps (design §2).
  Overlap overlap = Overlap::kNone;
  // With "delayed": the inner steps of round r + 1 run before round r's update is folded in
  // (1..inner_steps; 0 = inner_steps / 10, at least 1). More hides slower links; fewer keeps
  // the providers closer to the global model.
  int delay_steps = 0;
  // With "delayed", when the update is folded in. "step": at delay_steps exactly, so that a run
  // is reproducible bit for bit. "arrival": at the first step boundary after it has come in
  // (at delay_steps at the latest): the fewest steps from a stale start, and so the least loss,
  // but where the fold falls depends on the link's timing (θ_pub is identical everywhere still).
  Fold fold = Fold::kStep;
  // When a round's new θ_pub comes in, the share of its own parameters' offset from it that a
  // provider keeps: it goes on from θ_pub + keep_local · (θ_own − θ_pub), θ_own being where its
  // last round ended (Streaming DiLoCo's mixing factor, arXiv 2501.18512). With "delayed" the
  // fold becomes θ ← θ_pub(r) + keep_local · (base − θ_pub(r)) + (θ − base). 0: DiLoCo, every
  // round starts from θ_pub. A provider that joins, resynchronises or is redirected starts
  // from θ_pub.
  double keep_local = 0;
  // Streaming DiLoCo's fragments (arXiv 2501.18512): the model's parameter tensors in this many
  // contiguous groups of about equal size, and round r syncs group (r − 1) mod fragments only,
  // so a round's frames are 1/fragments of the model and each parameter is synced every
  // fragments × inner_steps steps. Between its syncs a group keeps the provider's progress.
  // With "delayed" the update comes back 1/fragments as late. 1: every round syncs all.
  int fragments = 1;
  // 0: every round is H = inner_steps steps. > 0: a provider trains until this many seconds of
  // the round have passed (at least min_inner_steps, at most inner_steps steps); the head
  // weights contributions by their tokens, and the inner schedule follows the round's progress.
  // With "delayed", a round's budget is less what the provider's rounds so far ran over it
  // (pace.h budget_carry), so that providers' chained rounds stay on one clock. Goes with
  // fragments (each round's budget is one fragment's round).
  double round_budget_s = 0;
  int min_inner_steps = 1;
  // A named, measured setting (README "Recipes", experiments/RESULTS.md): "lan", "wan",
  // "wan-sparse" or "unequal" sets the outer keys it names first; a key given beside it in the
  // same file wins. Given by --set, it goes over the file's keys, under the other --set keys
  // (load_config). "" sets nothing. `xloco config --explain` shows each key it set as source "recipe".
  std::string recipe = "";
};

struct Config {
  RunConfig run;
  DataConfig data;
  ModelConfig model;
  InnerConfig inner;
  OuterConfig outer;
};

// Rounds of a DiLoCo run: ceil(inner.steps / outer.inner_steps).
int total_rounds(const Config& c);
// What a DiLoCo run (head, local) needs beyond a valid config: outer.inner_steps (H) no larger
// than inner.steps (else the run is one short round, not what H says). Throws ConfigError.
void check_diloco_schedule(const Config& c);
// A hash of everything that must agree between the head and its providers (model, data,
// schedule, outer settings, seed) and nothing host-specific (threads, device, paths): the keys
// of scope "agreed" in the field table (config.cpp), a key added after checkpoints existed only
// where it is set away from its default, so that a run's checkpoints resume after an upgrade.
std::string config_hash(const Config& c);

// Parses and validates; throws ConfigError naming the field, the value and the allowed range.
Config parse_config(const nlohmann::json& j);
// A config a run wrote earlier (a checkpoint's state.json), parsed as it meant: a relayed
// downlink written as outer.codec_down "relay" (before outer.downlink) is read as
// outer.downlink "relay". A config a user gives is refused for it instead (parse_config).
Config parse_stored_config(nlohmann::json j);
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Applies "a.b=value" (value parsed as JSON, else taken as a string) to a JSON document.
void apply_override(nlohmann::json& j, const std::string& assignment);
// The 1-based line and column in `text` of its `byte`-th character (nlohmann's
// parse_error::byte, the last character read, counted from 1): where a JSON error is reported.
std::pair<size_t, size_t> line_and_column(const std::string& text, size_t byte);
// The recipes: name and when to pick it, in the order of the README's table.
struct RecipeInfo {
  std::string name;
  std::string pick_when;
  std::vector<std::string> sets;  // "key=value", as --set takes them
};
const std::vector<RecipeInfo>& recipes();
// `xloco config --explain`: every key of the config that `path` with `overrides` loads to, with
// where its value came from ("default", "recipe", "preset", "file", "--set", or "derived": set from the
// data or the module, as model.vocab_size from meta.json) and, for a key that does
// nothing with this config, why (the rule naming the key that governs it; "" otherwise).
struct KeyExplained {
  std::string key;
  std::string value;   // as JSON text
  std::string source;  // default | recipe | preset | file | --set | derived
  std::string scope;   // agreed (in config_hash) | own (each machine's) | head (the head's alone)
  std::string inert;   // "applies only with …", or ""
};
std::vector<KeyExplained> explain_config(const std::string& path,
                                         const std::vector<std::string>& overrides,
                                         const Config& resolved);
nlohmann::json to_json(const Config& c);
std::string to_json_string(const Config& c);

}  // namespace xloco::common
