#include "outer/provider/provider_round.h"

#include <torch/torch.h>

namespace xloco::outer {

void RoundBase::begin(uint64_t r, torch::Tensor& theta, const torch::Tensor& theta_pub,
                      const Leader& lead) {
  torch::NoGradGuard guard;
  if (sent_round_ != 0 && sent_round_ + 1 == r) {
    // outer.fragments: only the tensors round r − 1 synced take the new θ_pub (with
    // keep_local's share of their own); the others keep their progress since their sync.
    const Fragment& f = lead.fragment(r - 1);
    torch::Tensor p = theta.narrow(0, f.begin, f.numel());
    const torch::Tensor pub = theta_pub.narrow(0, f.begin, f.numel());
    if (keep_local_ > 0) {
      torch::Tensor own = p.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
      own.sub_(pub).mul_(keep_local_).add_(pub);
      p.copy_(own);
    } else {
      p.copy_(pub);
    }
  } else if (own_round_ != 0 && own_round_ + 1 == r) {
    // outer.keep_local: from θ_pub + a · (θ_own − θ_pub), θ_own where round r − 1 ended.
    own_.sub_(theta_pub).mul_(keep_local_).add_(theta_pub);
    theta.copy_(own_);
  } else {
    theta.copy_(theta_pub);
  }
  own_round_ = 0;
  sent_round_ = 0;
}

void RoundBase::set_base(uint64_t r, bool chained, const torch::Tensor& theta, const Leader& lead) {
  if (!delayed_) return;
  torch::NoGradGuard guard;
  if (!base_.defined()) base_ = torch::empty({theta.numel()}, torch::kFloat32);
  if (chained && lead.fragment(r - 1).numel() != base_.numel()) {
    const Fragment& f = lead.fragment(r - 1);
    base_.narrow(0, f.begin, f.numel()).copy_(theta.narrow(0, f.begin, f.numel()));
  } else {
    base_.copy_(theta);
  }
}

void RoundBase::fold(uint64_t r, torch::Tensor& theta, const torch::Tensor& theta_pub,
                     const Leader& lead) {
  torch::NoGradGuard guard;
  // In place (on a GPU, in its host copy): no model-sized temporaries. With outer.fragments
  // only the tensors round r − 1 synced move: θ_pub changed there alone.
  const Fragment& f = lead.fragment(r - 1);
  torch::Tensor part = theta.narrow(0, f.begin, f.numel());
  torch::Tensor host = part.is_cpu() ? part : part.to(torch::kCPU);
  const torch::Tensor base = base_.narrow(0, f.begin, f.numel());
  const torch::Tensor pub = theta_pub.narrow(0, f.begin, f.numel());
  host.sub_(base).add_(pub);
  if (keep_local_ > 0) host.add_(base, keep_local_).sub_(pub, keep_local_);
  if (!part.is_cpu()) part.copy_(host);
  base_.narrow(0, f.begin, f.numel()).copy_(pub);
}

torch::Tensor RoundBase::delta(uint64_t r, torch::Tensor& theta, const torch::Tensor& theta_pub,
                               const Leader& lead) {
  torch::NoGradGuard guard;
  torch::Tensor delta;
  const Fragment& f = lead.fragment(r);
  if (f.numel() != theta.numel()) {
    // outer.fragments: δ of this round's tensors only, in a buffer of its own; θ (and the
    // base, with overlap) lives on, since the other fragments' progress is not sent yet.
    if (!delta_.defined()) delta_ = torch::empty({theta.numel()}, torch::kFloat32);
    delta = delta_;
    auto d = delta.narrow(0, f.begin, f.numel());
    const torch::Tensor from = delayed_ ? base_ : theta_pub;
    torch::sub_out(d, from.narrow(0, f.begin, f.numel()),
                   theta.narrow(0, f.begin, f.numel()).to(torch::kCPU));
    if (!delayed_) sent_round_ = r;
  } else if (delayed_) {
    // δ in the base's memory: θ lives on as the next round's start.
    delta = base_;
    torch::sub_out(delta, base_, theta.is_cpu() ? theta : theta.to(torch::kCPU));
  } else {
    if (keep_local_ > 0) {
      // outer.keep_local: where this round ended, for the next round's start.
      if (!own_.defined()) own_ = torch::empty({theta.numel()}, torch::kFloat32);
      own_.copy_(theta);
      own_round_ = r;
    }
    // δ = θ_pub − θ in θ's own memory (on a GPU, in its host copy): θ is spent now, and the
    // next round starts by overwriting it with θ_pub.
    delta = theta.is_cpu() ? theta : theta.to(torch::kCPU);
    torch::sub_out(delta, theta_pub, delta);
  }
  return delta;
}

}  // namespace xloco::outer
