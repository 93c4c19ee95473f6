#include "outer/head/global_model.h"

#include <charconv>

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/metrics.h"
#include "common/text.h"
#include "compress/torch_adapter.h"
#include "inner/data.h"
#include "inner/hf.h"
#include "inner/model.h"
#include "outer/round/sync.h"

namespace xloco::outer {
namespace {

std::string hash_of(const torch::Tensor& t) {
  return common::hash_hex(t.data_ptr(), static_cast<size_t>(t.numel()) * sizeof(float));
}

}  // namespace

GlobalModel::GlobalModel(const common::Config& config, const std::string& init)
    : config_(config),
      data_(inner::make_dataset(config, {0, 1})),
      evaluator_(std::make_unique<inner::InnerTrainer>(config, inner::make_model(config), solo_,
                                                       torch::Device(torch::kCPU))),
      downlink_(make_downlink(config)),
      aggregator_(evaluator_->layout(), config.outer.norm_bound, downlink_->keeps_frames(),
                  config.outer.norm_clip),
      state_enc_(full_state_codec()) {
  opt_ = std::make_unique<OuterOptimizer>(config.outer, layout().numel, layout().buffers_offset);
  fragments_ = split_fragments(layout(), config.outer.fragments);
  if (!init.empty()) {
    evaluator_->load_model(inner::load_init_weights(init));
    spdlog::info("warm start from {}", init);
  }
  theta_true_ = theta_pub().clone();
  pub_hash_ = evaluator_->param_hash();
  if (config.outer.score) {
    common::Config sc = config;
    sc.inner.eval_batches = config.outer.score_batches;
    score_group_ = std::make_unique<inner::Group>(inner::DistOptions{});
    score_data_ = inner::make_dataset(sc, {0, 1});
    scorer_ = std::make_unique<inner::InnerTrainer>(sc, inner::make_model(sc), *score_group_,
                                                    torch::Device(torch::kCPU));
    aggregator_.set_scorer([this](const std::string& peer, const net::Frame& frame, float clip) {
      return score(peer, frame, clip);
    }, config.outer.score_relative);
    spdlog::info("outer.score: each contribution is scored alone on {} validation batches "
                 "(refused when it raises the loss by more than {:g}, or lowers it by less than "
                 "{:g} of the round's median fall)",
                 config.outer.score_batches, config.outer.score_margin, config.outer.score_relative);
  }
}

Aggregator::Score GlobalModel::score(const std::string& peer, const net::Frame& frame, float clip) {
  torch::NoGradGuard guard;
  const uint64_t round = pub_round_ + 1;  // the round being aggregated
  const Fragment& part = fragment(round);
  const double lr = outer_lr(config_.outer, static_cast<int64_t>(round), common::total_rounds(config_));
  torch::Tensor& p = scorer_->params();
  if (score_round_ != round) {
    p.copy_(theta_true_);
    score_base_ = scorer_->evaluate(*score_data_).loss;
    score_round_ = round;
  }
  if (!score_scratch_.defined()) score_scratch_ = torch::empty_like(theta_true_);
  score_scratch_.zero_();
  compress::decode(dec_, frame.data(), frame.size(), part.layout, score_scratch_);
  p.copy_(theta_true_);
  const int64_t trained = layout().trained_numel();
  p.narrow(0, 0, trained).sub_(score_scratch_.narrow(0, 0, trained), lr * clip);
  const double loss = scorer_->evaluate(*score_data_).loss;
  Aggregator::Score s{loss - score_base_, std::nullopt};
  if (!(s.change <= config_.outer.score_margin)) {  // a NaN loss is refused too
    s.refuse = fmt::format("alone, at the outer rate {:.3g}, it moves the loss on {} held-out "
                           "batches from {:.4f} to {:.4f} ({:+.4g}, over outer.score_margin {:g})",
                           lr, config_.outer.score_batches, score_base_, loss, s.change,
                           config_.outer.score_margin);
  }
  spdlog::debug("round {}: {} scores {:+.4g}", round, peer, s.change);
  return s;
}

std::int64_t GlobalModel::max_update_bytes() const {
  return downlink_->max_update_bytes(layout());
}

net::Update GlobalModel::update_for(const std::string& peer, const net::Update& update) const {
  return downlink_->for_peer(peer, update);
}

void GlobalModel::apply_to_pub(const net::Update& update, const Fragment& part) {
  downlink_->apply_to_pub(update, theta_pub(), theta_true_, part);
}

void GlobalModel::rehash() {
  prev_hash_ = pub_hash_;
  pub_hash_ = evaluator_->param_hash();
}

net::Frame GlobalModel::full_state() {
  if (auto owner = state_owner_.lock()) return net::Frame(std::move(owner), state_data_, state_size_);
  net::Frame frame(state_enc_.encode(compress::const_refs(layout(), theta_pub())));
  state_owner_ = frame.owner();
  state_data_ = frame.data();
  state_size_ = frame.size();
  return frame;
}

std::vector<std::pair<uint64_t, net::Body>> GlobalModel::join_messages(int shard, SyncAction sync) {
  std::vector<std::pair<uint64_t, net::Body>> out;
  if (sync == SyncAction::kUpdate) out.emplace_back(pub_round_, last_update_);
  net::Welcome w;
  w.shard_index = static_cast<uint32_t>(shard);
  w.shard_count = config_.outer.shared_data ? 1u : static_cast<uint32_t>(config_.outer.providers);
  if (sync == SyncAction::kFullState) w.state = full_state();
  out.emplace_back(pub_round_, std::move(w));
  if (!pending_.empty()) out.emplace_back(pub_round_ + 1, pending_);
  return out;
}

namespace {
struct Cancelled {};  // thrown between evaluation batches to stop early
}  // namespace

void GlobalModel::start_evaluation() {
  XLOCO_ENFORCE(!evaluating(), common::Error, "an evaluation is already running");
  eval_done_ = false;
  eval_cancel_ = false;
  eval_result_.reset();
  eval_error_ = nullptr;
  eval_thread_ = std::thread([this] {
    try {
      eval_result_ = evaluator_->evaluate(*data_, [this] {
        if (eval_cancel_) throw Cancelled{};
      });
    } catch (const Cancelled&) {
    } catch (...) {
      eval_error_ = std::current_exception();
    }
    eval_done_ = true;
  });
}

std::optional<GlobalModel::Evaluation> GlobalModel::end_evaluation(bool wait, bool cancel) {
  if (!evaluating()) return std::nullopt;
  if (cancel) eval_cancel_ = true;
  if (!eval_done_ && !wait && !cancel) return std::nullopt;
  eval_thread_.join();
  if (eval_error_) std::rethrow_exception(std::exchange(eval_error_, nullptr));
  Evaluation e{pub_round_, std::exchange(eval_result_, std::nullopt)};
  if (!pending_.empty()) {
    apply_to_pub(pending_, fragment(pub_round_ + 1));
    last_update_ = std::exchange(pending_, {});
    state_owner_.reset();
    ++pub_round_;
    rehash();
  }
  return e;
}

GlobalModel::~GlobalModel() {
  if (evaluating()) {
    eval_cancel_ = true;
    eval_thread_.join();
  }
}

GlobalModel::Closed GlobalModel::close_round() {
  XLOCO_ENFORCE(pending_.empty(), common::Error,
                "round closed on a theta_pub one update behind: end the evaluation first");
  torch::NoGradGuard guard;
  Closed out;
  out.rejected = aggregator_.finish();
  out.accepted = aggregator_.added();
  out.clipped = aggregator_.clipped();
  out.scores = aggregator_.scores();
  const Fragment& part = fragment(pub_round_ + 1);  // the round closing
  const double lr = outer_lr(config_.outer, pub_round_ + 1, common::total_rounds(config_));
  opt_->set_lr(lr);
  HeadStep step = downlink_->close({aggregator_, *opt_, theta_true_, theta_pub(), layout(), part, lr});
  out.update = std::move(step.update);
  out.discarded = std::move(step.discarded);
  out.trust_scaled = step.trust_scaled;
  out.trust_ratio = step.trust_ratio;
  out.deferred = evaluating();
  if (out.deferred) {
    pending_ = out.update;  // θ_pub is being read: the update waits for the evaluation to end
    return out;
  }
  apply_to_pub(out.update, part);
  last_update_ = out.update;  // the previous round's is stale now: never hold two
  state_owner_.reset();       // so is a full state of the old θ_pub
  ++pub_round_;
  return out;
}

std::string GlobalModel::write_checkpoint(const std::string& root, HeadCheckpointState state,
                                          int keep) {
  common::CheckpointContents c;
  for (const auto& s : layout().slots) {
    c.files["model.safetensors"].push_back(
        inner::view_blob(s.name, theta_true_.narrow(0, s.offset, s.numel).view(s.shape)));
  }
  // Per-rank state (int buffers) as the module had it, so that load_state_dict finds every key.
  for (const auto& t : evaluator_->model().local_state()) {
    c.files["model.safetensors"].push_back(inner::to_blob(t.name, t.tensor));
  }
  c.files["outer.safetensors"] = {inner::view_blob("momentum", opt_->momentum()),
                                  inner::view_blob("theta_pub", theta_pub())};
  state.theta_pub_hash = hash_of(theta_pub());
  state.momentum_hash = hash_of(opt_->momentum());
  state.norm_history.clear();
  for (const auto& [part, norms] : aggregator_.norm_history()) {
    state.norm_history[std::to_string(part)] = norms;
  }
  c.state = state;
  return common::write_checkpoint(root, fmt::format("round-{:06d}", state.round), c, keep);
}

HeadCheckpointState GlobalModel::resume(const std::string& root, const std::string& config_hash) {
  const auto candidates = common::checkpoint_candidates(root);
  XLOCO_ENFORCE(!candidates.empty(), common::IoError, "--resume: no checkpoint under {}", root);
  std::vector<std::string> skipped;
  for (const auto& dir : candidates) {
    bool legacy = false;
    if (const auto problem = common::verify_checkpoint(dir, &legacy)) {
      spdlog::warn("resume: skipping {}: {}; falling back to the one before it", dir, *problem);
      skipped.push_back(dir + ": " + *problem);
      continue;
    }
    if (legacy) spdlog::warn("resume: {} has no {} (written before manifests): not verified", dir, common::kManifestFile);
    try {
      auto state = load_checkpoint(dir, config_hash);
      if (!skipped.empty()) {
        spdlog::warn("resumed from {}, not the newest checkpoint: {}", dir, fmt::join(skipped, "; "));
      }
      return state;
    } catch (const common::ConfigError&) {
      throw;  // the run's config differs: no older checkpoint will do better
    } catch (const std::exception& e) {  // any error (JSON, torch, I/O) of any file: the next
      const std::string why = common::printable(e.what(), 512);
      spdlog::warn("resume: skipping {}: {}; falling back to the one before it", dir, why);
      skipped.push_back(dir + ": " + why);
    }
  }
  throw common::IoError(fmt::format("--resume: no usable checkpoint under {}: {}", root,
                                    fmt::join(skipped, "; ")));
}

HeadCheckpointState GlobalModel::load_checkpoint(const std::string& dir, const std::string& config_hash) {
  const auto state = read_document<HeadCheckpointState>(dir + "/state.json");
  XLOCO_ENFORCE(state.config_hash == config_hash, common::ConfigError,
                "--resume: {} was written with a different config (hash {} vs {})", dir,
                state.config_hash, config_hash);
  const auto outer_file = common::read_safetensors(dir + "/outer.safetensors");
  const auto* mom = outer_file.find("momentum");
  const auto* tp = outer_file.find("theta_pub");
  XLOCO_ENFORCE(mom && tp, common::IoError, "{}/outer.safetensors lacks momentum/theta_pub", dir);
  evaluator_->load_model(common::read_safetensors(dir + "/model.safetensors"));
  theta_true_.copy_(theta_pub());
  theta_pub().copy_(inner::from_blob(*tp));
  opt_->momentum().copy_(inner::from_blob(*mom));
  XLOCO_ENFORCE(hash_of(theta_pub()) == state.theta_pub_hash, common::IoError,
                "{}: theta_pub does not match its hash in state.json", dir);
  XLOCO_ENFORCE(hash_of(opt_->momentum()) == state.momentum_hash, common::IoError,
                "{}: outer momentum does not match its hash in state.json", dir);
  Aggregator::NormHistory norms;
  for (const auto& [part, by_peer] : state.norm_history) {
    size_t index = 0;
    const auto* end = part.data() + part.size();
    XLOCO_ENFORCE(std::from_chars(part.data(), end, index).ptr == end && !part.empty(),
                  common::IoError, "{}: norm_history has a fragment \"{}\"", dir,
                  common::printable(part, 32));
    norms[index] = by_peer;
  }
  aggregator_.restore_norm_history(std::move(norms));
  pub_hash_ = state.theta_pub_hash;
  prev_hash_.clear();
  pub_round_ = state.round;
  state_owner_.reset();
  spdlog::info("resumed from {}: round {} done, theta_pub {}, momentum {}", dir, state.round,
               state.theta_pub_hash, state.momentum_hash);
  return state;
}

}  // namespace xloco::outer
