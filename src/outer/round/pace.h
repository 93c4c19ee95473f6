// How a provider paces its rounds (design §2, §9), as pure functions of (progress, config):
// when a round's inner steps end (H fixed steps, or outer.round_budget_s of time), where the
// inner learning-rate schedule stands meanwhile, whether the next round starts before the last
// one's update has arrived (outer.overlap), and how the head weights contributions of unequal
// work. provider.cpp and aggregate.cpp carry the verdicts out; tests check the rules alone.
#pragma once

#include <cstdint>
#include <string>

#include "common/config.h"

namespace xloco::outer {

// The inner steps round `round` has in the run's schedule: H = outer.inner_steps, fewer in a
// last round that inner.steps cuts short.
int64_t steps_in_round(uint64_t round, const common::Config& c);

struct StepVerdict {
  bool more = false;  // run another inner step in this round
  std::string reason;  // why the round's steps end (empty while they go on)
};

// After `done` inner steps of round `round`, `elapsed_s` into its compute, the last step having
// taken `step_s`: another step while the round has steps left in the run (inner.steps) and below
// H = outer.inner_steps, and with a time budget while fewer than outer.min_inner_steps have run
// or the next step would end nearer the budget than not (elapsed + step_s / 2 < budget): a slow
// provider's last step overshoots the budget by at most half a step, and ends early by as much.
// `carry_s` (budget_carry) is taken off the budget: what the provider's earlier chained rounds
// ran over it (under it when negative).
StepVerdict next_step(uint64_t round, int64_t done, double elapsed_s, const common::Config& c,
                      double step_s = 0, double carry_s = 0);

// With a time budget and chained rounds (outer.overlap = "delayed"), each provider's rounds
// follow one another with no wait, so an over- or undershoot of each round's budget (up to half
// a step, the same sign every round for a given step time) would add up and carry one provider
// whole rounds ahead of the others, to wait at its fold. So the next round's budget is the
// budget less what the rounds so far ran over: the carry after a round of `elapsed_s` of
// compute, started with `carry_s`, is carry + elapsed − budget, kept within ± budget / 2 (a
// round capped by H, which ends early every round, must not bank time without end). A round
// that starts after a wait (not chained) starts from 0. 0 without a budget.
double budget_carry(double carry_s, double elapsed_s, const common::Config& c);

// The inner schedule's position (in steps) for step `done` of round `round`: (round − 1)·H + f·H
// with f the larger of done / H and elapsed_s / budget (below 1): a provider 4× slower than
// another runs a quarter of the steps in a budgeted round but the same part of the schedule.
// Without a budget it is the step index itself, (round − 1)·H + done.
double schedule_position(uint64_t round, int64_t done, double elapsed_s, const common::Config& c);

// The weight of a contribution of `tokens` in Δ = Σ wᵢ·δᵢ / Σ wᵢ, relative to the first one
// added (`first_tokens`; 0 when this is the first): its tokens, capped by the round's schedule
// allowance (the head refuses a claim above it before this is asked), over the first's.
double contribution_weight(uint64_t tokens, uint64_t first_tokens, uint64_t allowance);

// The norm a contribution of `norm` over `tokens` is judged by (aggregate.h): scaled to a full
// round's work, norm · allowance / tokens, when it trained fewer tokens than the round's
// allowance (a slower provider under a time budget), so that it is compared with its faster
// peers on their footing, not as an outlier of its own speed. With fixed H every honest
// contribution has the allowance and keeps its norm; a claim of fewer tokens only raises a
// provider's own judged norm and lowers its weight. Linear in the work: a δ that grows slower
// than its steps is judged larger, by at most the square root of the speed ratio when its steps
// add up like noise. `allowance` 0 or `tokens` 0: the norm as it is.
double full_round_norm(double norm, uint64_t tokens, uint64_t allowance);

// With outer.overlap = "delayed", the provider goes on from round `round` straight into the
// next (speculatively: the head confirms it with ROUND_START, or a resync discards it), unless
// it was the run's last.
bool chains_next_round(uint64_t round, const common::Config& c);

// The step of a chained round at which the last round's update is folded in: outer.delay_steps,
// or inner_steps / 10 (at least 1) when it is 0. A round that ends sooner folds at its end.
int64_t fold_step(const common::Config& c);

struct FoldVerdict {
  bool fold = false;  // fold the last round's update in before step `done`
  bool wait = false;  // ... waiting for it if it has not come in
  std::string reason;
};

// Before step `done` of a chained round whose update has not been folded in yet, `arrived`
// telling whether it has come in: with outer.fold = "arrival", fold as soon as it has; at
// fold_step (outer.delay_steps) fold in any case, waiting for it if need be. With "step" the
// fold comes at fold_step alone, whenever the update arrived, so that a run is reproducible.
FoldVerdict fold_now(int64_t done, bool arrived, const common::Config& c);

// The test device for providers of unequal speed on one machine (design §9, not a feature):
// XLOCO_THROTTLE="provider-3=4,provider-1=2" makes each named provider this many times slower
// by sleeping (factor − 1) × each step's compute after it. The factor for `name` (1 = none);
// throws common::ConfigError on a malformed list.
double throttle_factor(const char* env, const std::string& name);

}  // namespace xloco::outer
