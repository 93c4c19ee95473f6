// The outer optimizer of DiLoCo: SGD with (Nesterov) momentum on the flat parameter buffer,
// stepping along the token-weighted average pseudo-gradient Δ. PyTorch's SGD semantics:
// buf ← μ·buf + Δ; step = Nesterov ? Δ + μ·buf : buf; θ ← θ − lr·step.
#pragma once

#include <cstdint>
#include <optional>

#include <torch/types.h>

#include "common/config.h"

namespace xloco::outer {

class OuterOptimizer {
 public:
  // Elements from `averaged_from` on (a model's float buffers: batch-norm statistics) are set to
  // the providers' average, θ ← θ − Δ, with no momentum; -1 = none.
  OuterOptimizer(const common::OuterConfig& config, int64_t numel, int64_t averaged_from = -1);
  void step(torch::Tensor& theta, const torch::Tensor& delta);
  // The first flat index at which step(theta, delta) would leave θ or the momentum non-finite
  // (or at which Δ is), computed chunk by chunk with the same operations as step() and written
  // nowhere; nullopt when the step is sound. A round that fails it is discarded (design §7).
  std::optional<int64_t> non_finite_at(const torch::Tensor& theta, const torch::Tensor& delta) const;
  torch::Tensor& momentum() { return momentum_; }

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
};

// outer.lookahead (design §2): a delayed provider's forecast of the head's next outer step, so
// that it trains the next round from where θ_pub is about to go rather than from where its own
// round ended. It keeps its own copy of the outer momentum: built from its own δ in place of the
// providers' average Δ, and corrected each time the real θ_pub comes in. With one provider on
// fp32 links the forecast is the head's step exactly (the same operations, in the same order).
class UpdateForecast {
 public:
  UpdateForecast(const common::OuterConfig& config, int64_t numel, int64_t averaged_from = -1);
  // In place: `delta` (the provider's own δ for the round) becomes the forecast θ_pub − lr·step
  // of OuterOptimizer::step with δ for Δ, and the momentum takes δ in as the head's takes Δ.
  void predict(const torch::Tensor& theta_pub, torch::Tensor& delta);
  // The round's θ_pub has come in, `miss` = forecast − θ_pub: the momentum takes the head's Δ
  // in place of δ. The step is linear in Δ, so Δ − δ = miss / (lr · (1 + μ)) with Nesterov
  // (miss / lr without).
  void correct(const torch::Tensor& miss);
  // Forget the momentum (a provider redirected or resynchronised: θ_pub jumped).
  void reset();
  const torch::Tensor& momentum() const { return momentum_; }

 private:
  int64_t averaged_from_;
  double lr_, mu_;
  bool nesterov_;
  torch::Tensor momentum_;  // undefined when μ = 0
};

}  // namespace xloco::outer
