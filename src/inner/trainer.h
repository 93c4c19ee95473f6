// The inner trainer of one provider: AdamW (decoupled weight decay on >=2-D weights only),
// linear warm-up then cosine decay, global grad-norm clipping, and the per-step gradient
// allreduce over the provider's ranks. Parameters and gradients live in two flat buffers
// (every module parameter is a view into them), so AdamW, clipping, the allreduce and later the
// outer sync each touch one contiguous tensor instead of one small tensor per parameter.
#pragma once

#include <map>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "common/config.h"
#include "common/layout.h"
#include "common/safetensors.h"
#include "inner/data.h"
#include "inner/dist.h"
#include "inner/model.h"

namespace xloco::inner {

struct StepStats {
  double loss = 0;        // mean over the provider batch (all ranks)
  double lr = 0;
  double grad_norm = 0;   // before clipping
  int64_t tokens = 0;     // processed by the provider this step (all ranks)
  bool stop = false;      // some rank asked to stop (e.g. Ctrl+C): all ranks stop together
};

struct EvalStats {
  double loss = 0;                  // mean per token (gpt) or per image (cnn)
  std::optional<double> accuracy;   // cnn only
  int64_t count = 0;
};

class InnerTrainer {
 public:
  InnerTrainer(const common::Config& config, std::shared_ptr<Net> model, Group& group,
               torch::Device device);

  // One optimizer step at global inner step `step` (0-based), on this rank's slice of the batch.
  // `want_stop` rides the gradient allreduce, so every rank learns of it at the same step.
  // `schedule_pos` (≥ 0) is where the learning-rate schedule stands, in steps, when it is not
  // `step` itself: a time-budgeted DiLoCo round runs fewer steps than its share of the
  // schedule (outer.round_budget_s), and its schedule follows the round's progress.
  StepStats train_step(const Dataset& data, int64_t step, bool want_stop = false,
                       double schedule_pos = -1);
  // `between_batches` (optional) runs after every eval batch: the head answers its providers
  // from there, so a long evaluation never makes it deaf.
  EvalStats evaluate(const Dataset& data, const std::function<void()>& between_batches = {});
  double lr_at(int64_t step) const { return lr_at_position(static_cast<double>(step)); }
  double lr_at_position(double step) const;  // warm-up then cosine, at a fractional step
  // The random stream of this trainer's forward passes (a provider: its shard index), mixed
  // with run.seed, the step and the rank.
  void set_rng_stream(uint64_t stream) { rng_stream_ = stream; }

  // Where each parameter lives in params(): >=2-D weights first, then the rest.
  const common::FlatLayout& layout() const { return layout_; }

  Net& model() { return *model_; }
  torch::Tensor& params() { return params_; }  // flat fp32, every parameter a view into it
  int64_t adam_steps() const { return adam_t_; }
  std::string param_hash() const;  // BLAKE2b of the flat parameters (on CPU)
  void reset_optimizer();

  // Checkpoint state: the model under its nanoGPT names, and the AdamW moments (borrowed:
  // write them before the next step).
  std::vector<common::TensorBlob> model_blobs() const;
  std::vector<common::TensorBlob> optimizer_blobs() const;
  void load_model(const common::SafetensorsFile& file);  // names and shapes must match
  void load_optimizer(const common::SafetensorsFile& file);
  // Every rank takes rank 0's AdamW moments and step count (a leader that loaded a saved state);
  // a collective: all ranks call it.
  void broadcast_optimizer();

 private:
  void apply_adamw(double lr);

  common::Config config_;
  std::shared_ptr<Net> model_;
  Group& group_;
  torch::Device device_;
  void ensure_training_buffers();

  common::FlatLayout layout_;
  int64_t decay_numel_ = 0;
  uint64_t rng_stream_ = 0;
  torch::Tensor params_, grads_;  // grads_ ends with two extra slots: loss, stop request
  torch::Tensor exp_avg_, exp_avg_sq_;  // allocated at the first step (the head never trains)
  int64_t adam_t_ = 0;
};

// Tensor <-> safetensors blob helpers shared by checkpoints. to_blob copies; view_blob borrows
// a contiguous CPU fp32 tensor's memory (copies anything else), so the tensor's storage must
// outlive the write — it streams a large model to disk without a second copy in RAM.
common::TensorBlob to_blob(const std::string& name, const torch::Tensor& t);
common::TensorBlob view_blob(const std::string& name, const torch::Tensor& t);
torch::Tensor from_blob(const common::TensorBlob& blob);

}  // namespace xloco::inner
