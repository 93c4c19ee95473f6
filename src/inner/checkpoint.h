// Training checkpoints of one provider (`xloco train`): model.safetensors (nanoGPT names),
// optim.safetensors (AdamW moments) and state.json (step, effective config), in the atomic
// directory layout of common/checkpoint.h. Also loads a model back for eval and sample.
#pragma once

#include <memory>
#include <string>

#include "common/config.h"
#include "inner/model.h"
#include "inner/trainer.h"

namespace xloco::inner {

std::string save_train_checkpoint(const std::string& root, const InnerTrainer& trainer,
                                  const common::Config& config, int64_t step, int keep = 3);

// Restores model and optimizer into `trainer`; returns the step to continue from.
int64_t resume_train_checkpoint(const std::string& dir, InnerTrainer& trainer);

struct LoadedModel {
  common::Config config;
  std::shared_ptr<Net> model;
  int64_t step = 0;
};
// Builds the model of DIR/state.json's config and loads DIR/model.safetensors into it.
LoadedModel load_model_checkpoint(const std::string& dir, const std::string& device = "cpu");

}  // namespace xloco::inner
