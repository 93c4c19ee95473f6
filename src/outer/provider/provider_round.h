// Where a provider leader's round starts and what its δ is measured against (design §2): θ_pub
// (synchronous rounds), θ_pub with keep_local's share of where the last round ended, only the
// last round's fragment (outer.fragments), or, with outer.overlap = delayed, a base that the
// fold moves onto each new θ_pub. The leader's state for it (base, own, what it sent last) lives
// here, and every formula over θ and θ_pub is one of begin, set_base, fold and delta. The
// leader alone holds one; provider.cpp broadcasts θ to its other ranks between the steps.
#pragma once

#include <cstdint>

#include <torch/types.h>

#include "common/config.h"
#include "outer/provider/provider_leader.h"

namespace xloco::outer {

class RoundBase {
 public:
  explicit RoundBase(const common::Config& cfg)
      : keep_local_(cfg.outer.keep_local), delayed_(cfg.outer.overlap == common::Overlap::kDelayed) {}

  // Round r (not chained) starts: θ ← θ_pub, or with outer.fragments only the tensors round
  // r − 1 synced take it (with keep_local's share of their own), or with keep_local θ_pub +
  // a · (θ_own − θ_pub), θ_own where round r − 1 ended.
  void begin(uint64_t r, torch::Tensor& theta, const torch::Tensor& theta_pub, const Leader& lead);
  // With outer.overlap = delayed, after every rank holds round r's starting θ: the base its
  // progress is measured from (θ_pub, or the chained start until the fold); with fragments
  // only the tensors round r − 1 sent start again.
  void set_base(uint64_t r, bool chained, const torch::Tensor& theta, const Leader& lead);
  // The fold of chained round r: θ ← θ_pub(r − 1) + (θ − base) (+ keep_local's share of the
  // base), base ← θ_pub(r − 1), over round r − 1's fragment; in place on θ's host copy.
  void fold(uint64_t r, torch::Tensor& theta, const torch::Tensor& theta_pub, const Leader& lead);
  // Round r's δ = base − θ over its fragment (base: θ_pub, or with overlap the θ_pub its last
  // fold brought in), in a buffer it may reuse: θ's own memory when θ is spent (synchronous,
  // whole model), else the base's or a δ buffer of its own.
  torch::Tensor delta(uint64_t r, torch::Tensor& theta, const torch::Tensor& theta_pub,
                      const Leader& lead);
  // Its own parameters belong to another θ_pub now (a full-state resync): start from θ_pub.
  void forget() { own_round_ = sent_round_ = 0; }

 private:
  const double keep_local_;
  const bool delayed_;
  torch::Tensor base_;  // what a delayed round's progress is measured from
  // Synchronous with keep_local > 0: where round own_round_ ended (0: none).
  torch::Tensor own_;
  uint64_t own_round_ = 0;
  // Synchronous with outer.fragments > 1: the round whose fragment it sent last (0: none), and
  // δ's buffer (θ keeps the other fragments' progress).
  uint64_t sent_round_ = 0;
  torch::Tensor delta_;
};

}  // namespace xloco::outer
