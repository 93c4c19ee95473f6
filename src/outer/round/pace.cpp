#include "outer/round/pace.h"

#include <algorithm>
#include <sstream>

#include <fmt/format.h>

#include "common/error.h"

namespace xloco::outer {

int64_t steps_in_round(uint64_t round, const common::Config& c) {
  const int64_t H = c.outer.inner_steps;
  const int64_t first = static_cast<int64_t>(round - 1) * H;
  return std::max<int64_t>(0, std::min<int64_t>(first + H, c.inner.steps) - first);
}

StepVerdict next_step(uint64_t round, int64_t done, double elapsed_s, const common::Config& c,
                      double step_s, double carry_s) {
  const int64_t cap = steps_in_round(round, c);
  if (done >= cap) {
    return {false, cap < c.outer.inner_steps ? fmt::format("the run's last {} steps are done", cap)
                                             : fmt::format("H = {} steps done", cap)};
  }
  const double budget = c.outer.round_budget_s - carry_s;
  if (c.outer.round_budget_s > 0 && elapsed_s + step_s / 2 >= budget &&
      done >= std::min<int64_t>(c.outer.min_inner_steps, cap)) {
    return {false, carry_s == 0
                       ? fmt::format("the round's budget of {:g}s is spent after {} steps", budget, done)
                       : fmt::format("the round's budget of {:g}s ({:+.3g}s carried over) is spent after {} steps",
                                     budget, -carry_s, done)};
  }
  return {true, ""};
}

double budget_carry(double carry_s, double elapsed_s, const common::Config& c) {
  const double budget = c.outer.round_budget_s;
  if (budget <= 0) return 0;
  return std::clamp(carry_s + elapsed_s - budget, -budget / 2, budget / 2);
}

double schedule_position(uint64_t round, int64_t done, double elapsed_s, const common::Config& c) {
  const double H = c.outer.inner_steps;
  const double base = static_cast<double>(round - 1) * H;
  if (c.outer.round_budget_s <= 0) return base + static_cast<double>(done);
  const double f = std::max(static_cast<double>(done) / H, elapsed_s / c.outer.round_budget_s);
  // Never past the round's last step: the next round starts where this one ends.
  return base + std::min(f * H, H - 1);
}

double contribution_weight(uint64_t tokens, uint64_t first_tokens, uint64_t allowance) {
  const auto capped = [allowance](uint64_t t) {
    return static_cast<double>(allowance > 0 ? std::min(t, allowance) : t);
  };
  return first_tokens == 0 ? 1.0 : capped(tokens) / capped(first_tokens);
}

double full_round_norm(double norm, uint64_t tokens, uint64_t allowance) {
  if (allowance == 0 || tokens == 0 || tokens >= allowance) return norm;
  return norm * (static_cast<double>(allowance) / static_cast<double>(tokens));
}

bool chains_next_round(uint64_t round, const common::Config& c) {
  return c.outer.overlap == common::Overlap::kDelayed && static_cast<int>(round) < common::total_rounds(c);
}

int64_t fold_step(const common::Config& c) {
  if (c.outer.delay_steps > 0) return c.outer.delay_steps;
  return std::max<int64_t>(1, c.outer.inner_steps / 10);
}

FoldVerdict fold_now(int64_t done, bool arrived, const common::Config& c) {
  const int64_t at = fold_step(c);
  if (c.outer.fold == common::Fold::kArrival && arrived) {
    return {true, false, fmt::format("the update came in before step {} (outer.fold = arrival)", done)};
  }
  if (done >= at) {
    return {true, !arrived, fmt::format("step {} is outer.delay_steps: the update is folded in{}", at,
                                        arrived ? "" : ", waiting for it")};
  }
  return {false, false, ""};
}

double throttle_factor(const char* env, const std::string& name) {
  if (env == nullptr || *env == '\0') return 1.0;
  std::stringstream ss(env);
  std::string item;
  double found = 1.0;
  while (std::getline(ss, item, ',')) {
    const auto eq = item.find('=');
    double f = 0;
    bool ok = eq != std::string::npos && eq > 0;
    if (ok) {
      try {
        size_t used = 0;
        f = std::stod(item.substr(eq + 1), &used);
        ok = used == item.size() - eq - 1 && f >= 1 && f <= 1000;
      } catch (const std::exception&) {
        ok = false;
      }
    }
    XLOCO_ENFORCE(ok, common::ConfigError,
                  "XLOCO_THROTTLE: \"{}\" is not NAME=FACTOR with a factor in [1, 1000] (the test "
                  "device that slows named providers, e.g. provider-3=4)", item);
    if (item.substr(0, eq) == name) found = f;
  }
  return found;
}

}  // namespace xloco::outer
