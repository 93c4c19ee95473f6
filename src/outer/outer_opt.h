// The outer optimizer of DiLoCo: SGD with (Nesterov) momentum on the flat parameter buffer,
// stepping along the token-weighted average pseudo-gradient Δ. PyTorch's SGD semantics:
// buf ← μ·buf + Δ; step = Nesterov ? Δ + μ·buf : buf; θ ← θ − lr·step.
#pragma once

#include <torch/types.h>

#include "common/config.h"

namespace xloco::outer {

class OuterOptimizer {
 public:
  OuterOptimizer(const common::OuterConfig& config, int64_t numel);
  void step(torch::Tensor& theta, const torch::Tensor& delta);
  torch::Tensor& momentum() { return momentum_; }

 private:
  double lr_, mu_;
  bool nesterov_;
  torch::Tensor momentum_;
};

}  // namespace xloco::outer
