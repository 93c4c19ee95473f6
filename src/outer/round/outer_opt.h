// The outer optimizer of DiLoCo: SGD with (Nesterov) momentum on the flat parameter buffer,
// stepping along the token-weighted average pseudo-gradient Δ. PyTorch's SGD semantics:
// buf ← μ·buf + Δ; step = Nesterov ? Δ + μ·buf : buf; θ ← θ − lr·step.
#pragma once

#include <cstdint>
#include <optional>

#include <torch/types.h>

#include "common/config.h"

namespace xloco::outer {

// The outer learning rate of round `round` (1-based) of a run of `rounds`: outer.lr, or with
// outer.lr_end ≥ 0, lr + (lr_end − lr)·r/rounds, r clamped to [0, rounds], so that the last
// round steps at lr_end. A function of the round alone: a resumed head steps as it would have.
double outer_lr(const common::OuterConfig& config, int64_t round, int64_t rounds);

class OuterOptimizer {
 public:
  // Elements from `averaged_from` on (a model's float buffers: batch-norm statistics) are set to
  // the providers' average, θ ← θ − Δ, with no momentum; -1 = none.
  OuterOptimizer(const common::OuterConfig& config, int64_t numel, int64_t averaged_from = -1);
  void step(torch::Tensor& theta, const torch::Tensor& delta) { step(theta, delta, 0, theta.numel()); }
  // The step on the flat elements [begin, end) only (a fragment, outer.fragments): θ, Δ and
  // the momentum elsewhere are neither read nor written.
  void step(torch::Tensor& theta, const torch::Tensor& delta, int64_t begin, int64_t end);
  // The first flat index in [begin, end) at which step(theta, delta, begin, end) would leave θ
  // or the momentum non-finite (or at which Δ is), computed chunk by chunk with the same
  // operations as step() and written nowhere; nullopt when the step is sound. A round that
  // fails it is discarded (design §7).
  std::optional<int64_t> non_finite_at(const torch::Tensor& theta, const torch::Tensor& delta,
                                       int64_t begin, int64_t end) const;
  std::optional<int64_t> non_finite_at(const torch::Tensor& theta, const torch::Tensor& delta) const {
    return non_finite_at(theta, delta, 0, theta.numel());
  }
  torch::Tensor& momentum() { return momentum_; }
  // The lr of the steps from now on (outer_lr of the round closing).
  void set_lr(double lr) { lr_ = lr; }

 private:
  // θ ← θ − lr·step and buf ← μ·buf + Δ, in place on the tensors given (whole or a chunk).
  void apply(torch::Tensor& theta, torch::Tensor& momentum, const torch::Tensor& delta) const;
  // apply() on the elements [offset, offset + n) of θ, whichever rule each element follows.
  void apply_range(torch::Tensor& theta, torch::Tensor& momentum, const torch::Tensor& delta,
                   int64_t offset) const;

  int64_t averaged_from_;
  double lr_, mu_;
  bool nesterov_;
  torch::Tensor momentum_;
  // non_finite_at's copies of one chunk of θ and the momentum, allocated once: a check that
  // allocated them per chunk page-faulted in 2 × the model's bytes every round.
  mutable torch::Tensor chunk_theta_, chunk_momentum_;
};

}  // namespace xloco::outer
