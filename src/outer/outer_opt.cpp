#include "outer/outer_opt.h"

#include <torch/torch.h>

namespace xloco::outer {

OuterOptimizer::OuterOptimizer(const common::OuterConfig& config, int64_t numel)
    : lr_(config.lr), mu_(config.momentum), nesterov_(config.nesterov),
      momentum_(torch::zeros({numel}, torch::kFloat32)) {}

void OuterOptimizer::step(torch::Tensor& theta, const torch::Tensor& delta) {
  torch::NoGradGuard guard;
  if (mu_ == 0) {
    theta.add_(delta, -lr_);
    return;
  }
  momentum_.mul_(mu_).add_(delta);
  if (nesterov_) {
    theta.add_(delta, -lr_).add_(momentum_, -lr_ * mu_);
  } else {
    theta.add_(momentum_, -lr_);
  }
}

}  // namespace xloco::outer
