#include "outer/round/outer_opt.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>

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

namespace {

// Whether any of the n floats at each pointer is NaN or ±Inf: exponent bits all set. One
// branch-free pass the compiler vectorizes; the caller looks for where only when it is.
bool any_non_finite(const float* a, const float* b, const float* c, int64_t n) {
  constexpr uint32_t kExponent = 0x7f800000u;
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t x, y, z;
    std::memcpy(&x, a + i, 4);
    std::memcpy(&y, b + i, 4);
    std::memcpy(&z, c + i, 4);
    bad |= static_cast<uint32_t>((x & kExponent) == kExponent) |
           static_cast<uint32_t>((y & kExponent) == kExponent) |
           static_cast<uint32_t>((z & kExponent) == kExponent);
  }
  return bad != 0;
}

}  // namespace

std::optional<int64_t> OuterOptimizer::non_finite_at(const torch::Tensor& theta,
                                                     const torch::Tensor& delta, int64_t begin,
                                                     int64_t end) const {
  torch::NoGradGuard guard;
  constexpr int64_t kChunk = int64_t{1} << 20;
  if (!chunk_theta_.defined()) {
    chunk_theta_ = torch::empty({kChunk}, torch::kFloat32);
    chunk_momentum_ = torch::empty({kChunk}, torch::kFloat32);
  }
  for (int64_t o = begin; o < end; o += kChunk) {
    const int64_t c = std::min(kChunk, end - o);
    const auto d = delta.narrow(0, o, c);
    auto t = chunk_theta_.narrow(0, 0, c);
    auto m = chunk_momentum_.narrow(0, 0, c);
    t.copy_(theta.narrow(0, o, c));
    m.copy_(momentum_.narrow(0, o, c));
    apply_range(t, m, d, o);  // the same operations as step(), on copies of the chunk
    const float* tp = t.data_ptr<float>();
    const float* mp = m.data_ptr<float>();
    const float* dp = d.data_ptr<float>();
    if (!any_non_finite(tp, mp, dp, c)) continue;
    for (int64_t i = 0; i < c; ++i) {
      if (!std::isfinite(tp[i]) || !std::isfinite(mp[i]) || !std::isfinite(dp[i])) return o + i;
    }
  }
  return std::nullopt;
}

}  // namespace xloco::outer
