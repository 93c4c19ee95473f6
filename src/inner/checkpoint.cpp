#include "inner/checkpoint.h"

#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "inner/runtime.h"

namespace xloco::inner {

std::string save_train_checkpoint(const std::string& root, const InnerTrainer& trainer,
                                  const common::Config& config, int64_t step, int keep) {
  common::CheckpointContents c;
  c.files["model.safetensors"] = trainer.model_blobs();
  c.files["optim.safetensors"] = trainer.optimizer_blobs();
  c.state = {{"step", step},
             {"param_hash", trainer.param_hash()},
             {"config", common::to_json(config)}};
  return common::write_checkpoint(root, fmt::format("step-{:07d}", step), c, keep);
}

int64_t resume_train_checkpoint(const std::string& dir, InnerTrainer& trainer) {
  const auto state = common::read_checkpoint_state(dir);
  trainer.load_model(common::read_safetensors(dir + "/model.safetensors"));
  trainer.load_optimizer(common::read_safetensors(dir + "/optim.safetensors"));
  XLOCO_ENFORCE(state.contains("step") && state["step"].is_number_integer(), common::IoError,
                "{}/state.json has no integer step", dir);
  if (state.contains("param_hash")) {
    XLOCO_ENFORCE(state["param_hash"].get<std::string>() == trainer.param_hash(),
                  common::IoError, "{}: parameters do not match the hash in state.json", dir);
  }
  return state["step"].get<int64_t>();
}

LoadedModel load_model_checkpoint(const std::string& dir, const std::string& device) {
  const auto state = common::read_checkpoint_state(dir);
  XLOCO_ENFORCE(state.contains("config"), common::IoError, "{}/state.json has no config", dir);
  LoadedModel out;
  out.config = common::parse_stored_config(state["config"]);
  // Train checkpoints count inner steps; head checkpoints count rounds of outer.inner_steps.
  out.step = state.contains("step") ? state["step"].get<int64_t>()
                                    : state.value("round", int64_t{0}) * out.config.outer.inner_steps;
  out.model = make_model(out.config);
  const auto file = common::read_safetensors(dir + "/model.safetensors");
  torch::NoGradGuard guard;
  auto tensors = out.model->state();
  for (auto& l : out.model->local_state()) {
    if (file.find(l.name) != nullptr) tensors.push_back(l);  // per-rank state is optional
  }
  for (auto& p : tensors) {
    const auto* blob = file.find(p.name);
    XLOCO_ENFORCE(blob != nullptr, common::IoError, "{}/model.safetensors lacks {}", dir, p.name);
    auto t = from_blob(*blob);
    XLOCO_ENFORCE(t.sizes() == p.tensor.sizes(), common::IoError,
                  "{}: tensor {} has shape {}, the model needs {}", dir, p.name,
                  fmt::join(t.sizes(), "x"), fmt::join(p.tensor.sizes(), "x"));
    p.tensor.copy_(t);
  }
  out.model->to(resolve_device(device));
  return out;
}

}  // namespace xloco::inner
