#include "outer/provider/provider_state.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "outer/provider/leader_rules.h"
#include "outer/round/round.h"

namespace xloco::outer {
namespace fs = std::filesystem;
namespace {

// The uplink's error-feedback residuals, borrowed (not copied), one blob per tensor that has one.
std::vector<common::TensorBlob> residual_blobs(const compress::Encoder& uplink,
                                               const common::FlatLayout& layout) {
  std::vector<common::TensorBlob> residuals;
  for (const auto& s : layout.slots) {
    if (const auto* e = uplink.residual(s.name)) {
      common::TensorBlob b;
      b.name = s.name;
      b.dtype = "F32";
      b.shape = {static_cast<int64_t>(e->size())};
      b.borrowed = reinterpret_cast<const uint8_t*>(e->data());
      b.borrowed_size = e->size() * sizeof(float);
      residuals.push_back(std::move(b));
    }
  }
  return residuals;
}

}  // namespace

void SavedStateStore::save(uint64_t r, const std::string& base_hash, inner::InnerTrainer& trainer,
                           compress::Encoder& uplink, int shard, bool copy) {
  if (!enabled_) return;
  wait();
  auto contents = std::make_shared<common::CheckpointContents>();
  auto& c = *contents;
  c.files["optim.safetensors"] = trainer.optimizer_blobs();
  std::vector<common::TensorBlob> residuals = residual_blobs(uplink, trainer.layout());
  if (!residuals.empty()) c.files["residual.safetensors"] = std::move(residuals);
  c.state = {{"round", r},
             {"base_hash", base_hash},
             {"config_hash", common::config_hash(cfg_)},
             {"provider", opts_.name},
             {"shard", shard},
             {"adam_steps", trainer.adam_steps()}};
  // The blobs borrow the moments and the residuals: nothing touches them until the next
  // round trains (train_round), a fresh AdamW state replaces them (next_round) or the run
  // ends, and each of those joins this first. A delayed provider trains the next round at
  // once, so it saves a copy (3 × the parameters in host memory while the write runs)
  // rather than wait for the disk.
  if (copy) {
    for (auto& [file, blobs] : c.files) {
      for (auto& b : blobs) {
        if (b.borrowed == nullptr) continue;
        b.data.assign(b.borrowed, b.borrowed + b.borrowed_size);
        b.borrowed = nullptr;
        b.borrowed_size = 0;
      }
    }
  }
  saving_ = std::async(std::launch::async, [this, contents, r] {
    const auto start = Clock::now();
    try {
      common::write_checkpoint(root().string(), fmt::format("round-{:06d}", r), *contents, 1);
      if (save_failures_ > 0) {
        spdlog::info("provider {}: saved its state again after {} failed writes", opts_.name, save_failures_);
        save_failures_ = 0;
      }
    } catch (const std::exception& e) {
      ++save_failures_;
      const auto v = save_log_.check("save");
      if (v.log) {
        spdlog::warn("provider {}: could not save its state after round {} (a restart would "
                     "start a fresh AdamW state and residual): {}{}", opts_.name, r, e.what(),
                     common::LogLimiter::note(v));
      }
    }
    last_save_s_ = std::chrono::duration<double>(Clock::now() - start).count();
  });
}

double SavedStateStore::wait() {
  if (!saving_.valid()) return 0;
  const auto start = Clock::now();
  saving_.get();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool SavedStateStore::load(inner::InnerTrainer& trainer, Leader& lead,
                           const std::string& theta_pub_hash) {
  const std::string root = this->root().string();
  try {
    for (const auto& name : common::remove_stale_temp(root)) {
      spdlog::info("provider {}: removed {} left by an interrupted save", opts_.name, name);
    }
    common::check_writable(root);
  } catch (const std::exception& e) {
    enabled_ = false;
    spdlog::warn("provider {}: its state directory is not writable, so a restart will lose its "
                 "AdamW state and residual: {}", opts_.name, e.what());
    return false;
  }
  std::vector<std::string> skipped;
  const auto dir = common::latest_checkpoint(root, &skipped);
  for (const auto& why : skipped) spdlog::warn("provider {}: saved state skipped: {}", opts_.name, why);
  if (!dir) return false;
  try {
    const auto st = common::read_checkpoint_state(*dir);
    const SavedProviderState saved{st.at("round").get<uint64_t>(), st.at("base_hash").get<std::string>(),
                                   st.at("config_hash").get<std::string>()};
    const auto v = judge_saved_state(saved, lead.done_round(), theta_pub_hash,
                                     common::config_hash(cfg_));
    if (!v.resume) {
      spdlog::warn("provider {}: saved state {} discarded: {}", opts_.name, *dir, v.reason);
      return false;
    }
    trainer.load_optimizer(common::read_safetensors(*dir + "/optim.safetensors"));
    size_t restored = 0;
    if (fs::exists(*dir + "/residual.safetensors")) {
      const auto file = common::read_safetensors(*dir + "/residual.safetensors");
      for (const auto& blob : file.tensors) {
        const auto& slots = trainer.layout().slots;
        const auto it = std::find_if(slots.begin(), slots.end(),
                                     [&](const common::ParamSlot& s) { return s.name == blob.name; });
        const common::ParamSlot* slot = it == slots.end() ? nullptr : &*it;
        XLOCO_ENFORCE(slot != nullptr && blob.dtype == "F32" &&
                          blob.data.size() == static_cast<size_t>(slot->numel) * sizeof(float),
                      common::IoError, "{}/residual.safetensors: tensor {} is not one of the model's",
                      *dir, blob.name);
        std::vector<float> values(static_cast<size_t>(slot->numel));
        std::memcpy(values.data(), blob.data.data(), blob.data.size());
        lead.uplink().set_residual(blob.name, std::move(values));
        ++restored;
      }
    }
    lead.set_contributed(saved.round);
    spdlog::info("provider {}: resumed its AdamW state (step {}) and {} error-feedback residuals "
                 "from {}: {}", opts_.name, trainer.adam_steps(), restored, *dir, v.reason);
    return true;
  } catch (const std::exception& e) {
    trainer.reset_optimizer();
    lead.uplink().reset_residuals();
    spdlog::warn("provider {}: saved state {} discarded: {}", opts_.name, *dir, e.what());
    return false;
  }
}

}  // namespace xloco::outer
