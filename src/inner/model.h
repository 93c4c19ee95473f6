// The models of design §4 behind one interface: `gpt` (nanoGPT shape and parameter names,
// LM head tied to the token embedding), `cnn` (Fashion-MNIST), and `torchscript` (a module
// scripted in Python, script_model.cpp). Parameter names are the checkpoint names, so a Python
// user can load xloco weights into nanoGPT (or their own module) unchanged.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include "common/config.h"

namespace xloco::inner {

// One tensor of a model's state, under its checkpoint name.
struct StateTensor {
  std::string name;
  torch::Tensor tensor;
  bool trained = true;  // false: a float buffer (or frozen parameter), carried in θ, not trained
};

class Net : public torch::nn::Module {
 public:
  // Mean cross-entropy of the batch (gpt: over every position; cnn: over images).
  virtual torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y) = 0;
  // gpt: logits [b, T, vocab]; cnn: logits [b, 10].
  virtual torch::Tensor logits(const torch::Tensor& x) = 0;
  virtual int64_t context_length() const { return 0; }

  // Everything of the model that lives in θ: trained parameters, then float buffers. Built-in
  // models: their named_parameters(). A tensor tied to another appears once.
  virtual std::vector<StateTensor> state() {
    std::vector<StateTensor> out;
    for (const auto& p : named_parameters()) out.push_back({p.key(), p.value(), true});
    return out;
  }
  // State kept by each rank and written to checkpoints but not synchronised (integer buffers
  // such as batch norm's num_batches_tracked).
  virtual std::vector<StateTensor> local_state() { return {}; }
  // False when loss() is the only score (TorchScript modules without a `logits` method):
  // evaluation then averages loss() over the validation batches.
  virtual bool has_logits() const { return true; }
  // The vocabulary a text model was found to have (TorchScript: its logits' last dimension),
  // for the log; 0 when the model does not say (the built-in gpt's is model.vocab_size).
  virtual int64_t declared_vocab() const { return 0; }
  // Image models: `n` samples [n, C, H, W] in [0, 1] (TorchScript modules with `sample`).
  virtual bool can_sample() const { return false; }
  virtual torch::Tensor sample(int64_t n);
  torch::Device device();
};

// Builds and initialises the model of `config.model` (init seeded from run.seed), holding
// rng_mutex(): θ₀ is the same in every process and on every thread.
std::shared_ptr<Net> make_model(const common::Config& config);

// LibTorch's default generator is one per process. xloco seeds it and draws from it when it
// builds a model and in a step's or an evaluation batch's forward; where several of those run
// on threads of one process (in-process tests, a head beside its providers), each holds this
// lock from its seed to its last draw, so that it draws what it would in a process of its own
// (a provider's θ₀ must hash as the head's). Uncontended in a process with one trainer; never
// held across a collective.
std::mutex& rng_mutex();

// Trained parameters of the model (tied ones once).
int64_t count_parameters(Net& model);

// GPT sampling: continues the token ids `prompt` by `max_new` tokens (temperature, top-k;
// seeded); an empty prompt starts from token 10 (a newline in bytes).
std::vector<uint32_t> generate(Net& gpt, const std::vector<uint32_t>& prompt, int max_new,
                               double temperature, int top_k, uint64_t seed);

}  // namespace xloco::inner
