#include "outer/outer_opt.h"

#include <torch/torch.h>

#include <algorithm>

namespace xloco::outer {

double outer_lr(const common::OuterConfig& config, int64_t round, int64_t rounds) {
  if (config.lr_end < 0 || rounds <= 0) return config.lr;
  const double f = static_cast<double>(std::clamp<int64_t>(round, 0, rounds)) / static_cast<double>(rounds);
  return config.lr + (config.lr_end - config.lr) * f;
}

OuterOptimizer::OuterOptimizer(const common::OuterConfig& config, int64_t numel,
                               int64_t averaged_from)
    : averaged_from_(averaged_from < 0 ? numel : averaged_from), lr_(config.lr), mu_(config.momentum), nesterov_(config.nesterov),
      momentum_(torch::zeros({numel}, torch::kFloat32)) {}

void OuterOptimizer::apply(torch::Tensor& theta, torch::Tensor& momentum,
                           const torch::Tensor& delta) const {
  if (mu_ == 0) {
    theta.add_(delta, -lr_);
    return;
  }
  momentum.mul_(mu_).add_(delta);
  if (nesterov_) {
    theta.add_(delta, -lr_).add_(momentum, -lr_ * mu_);
  } else {
    theta.add_(momentum, -lr_);
  }
}

void OuterOptimizer::apply_range(torch::Tensor& theta, torch::Tensor& momentum,
                                 const torch::Tensor& delta, int64_t offset) const {
  const int64_t n = theta.numel();
  const int64_t stepped = std::clamp<int64_t>(averaged_from_ - offset, 0, n);
  if (stepped == n) {
    apply(theta, momentum, delta);
    return;
  }
  if (stepped > 0) {
    auto t = theta.narrow(0, 0, stepped), m = momentum.narrow(0, 0, stepped);
    apply(t, m, delta.narrow(0, 0, stepped));
  }
  theta.narrow(0, stepped, n - stepped).sub_(delta.narrow(0, stepped, n - stepped));
}

void OuterOptimizer::step(torch::Tensor& theta, const torch::Tensor& delta, int64_t begin,
                          int64_t end) {
  torch::NoGradGuard guard;
  if (begin == 0 && end == theta.numel()) {
    apply_range(theta, momentum_, delta, 0);
    return;
  }
  auto t = theta.narrow(0, begin, end - begin), m = momentum_.narrow(0, begin, end - begin);
  apply_range(t, m, delta.narrow(0, begin, end - begin), begin);
}

std::optional<int64_t> OuterOptimizer::non_finite_at(const torch::Tensor& theta,
                                                     const torch::Tensor& delta, int64_t begin,
                                                     int64_t end) const {
  torch::NoGradGuard guard;
  constexpr int64_t kChunk = int64_t{1} << 20;
  for (int64_t o = begin; o < end; o += kChunk) {
    const int64_t c = std::min(kChunk, end - o);
    const auto d = delta.narrow(0, o, c);
    auto t = theta.narrow(0, o, c).clone();
    auto m = momentum_.narrow(0, o, c).clone();
    apply_range(t, m, d, o);  // the same operations as step(), on copies of the chunk
    const auto bad = torch::isfinite(t).logical_and(torch::isfinite(m)).logical_and(torch::isfinite(d)).logical_not();
    if (bad.any().item<bool>()) return o + bad.nonzero()[0][0].item<int64_t>();
  }
  return std::nullopt;
}

}  // namespace xloco::outer
