// The two models of design §4 behind one interface: `gpt` (nanoGPT shape and parameter names,
// LM head tied to the token embedding) and `cnn` (Fashion-MNIST). Parameter names are the
// checkpoint names, so a Python user can load xloco weights into nanoGPT unchanged.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include "common/config.h"

namespace xloco::inner {

class Net : public torch::nn::Module {
 public:
  // Mean cross-entropy of the batch (gpt: over every position; cnn: over images).
  virtual torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y) = 0;
  // gpt: logits [b, T, vocab]; cnn: logits [b, 10].
  virtual torch::Tensor logits(const torch::Tensor& x) = 0;
  virtual int64_t context_length() const { return 0; }
};

// Builds and initialises the model of `config.model` (init seeded from run.seed).
std::shared_ptr<Net> make_model(const common::Config& config);

int64_t count_parameters(const torch::nn::Module& module);

// GPT sampling: continues the token ids `prompt` by `max_new` tokens (temperature, top-k;
// seeded); an empty prompt starts from token 10 (a newline in bytes).
std::vector<uint32_t> generate(Net& gpt, const std::vector<uint32_t>& prompt, int max_new,
                               double temperature, int top_k, uint64_t seed);

}  // namespace xloco::inner
