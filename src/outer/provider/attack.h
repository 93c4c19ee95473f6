// A test device for the attack table (issue 52, `make attack`): XLOCO_ATTACK makes named
// providers send a hostile pseudo-gradient instead of their own, on the real provider code, as
// XLOCO_THROTTLE makes them slow. Never set it in a real run: a provider started with it says so.
//
//   XLOCO_ATTACK=provider-3=scale:1000,provider-5=negate:9
//
//   scale:F   F·δ (a scaled frame)            negate:F  −F·δ (its honest direction, reversed)
//   zero      0 (drags a reference down)      noise:F   Gaussian noise of F·‖δ‖
//   ramp:F    F^(r−1)·δ in round r (a slow ramp, ×F a round)
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <torch/types.h>

namespace xloco::outer {

enum class AttackKind { kScale, kNegate, kZero, kNoise, kRamp };

struct Attack {
  AttackKind kind = AttackKind::kScale;
  double factor = 1;
  std::string text;  // as given, for the log
};

// `name`'s attack in XLOCO_ATTACK's text (null or empty: none). A malformed entry is a
// ConfigError naming it, whoever it is for.
std::optional<Attack> attack_for(const char* env, const std::string& name);

// What the attacker sends in round `round` instead of δ: a new tensor (δ is not touched).
// Noise is drawn from a generator seeded by the round, so a run is reproducible.
torch::Tensor apply_attack(const Attack& a, uint64_t round, const torch::Tensor& delta);

}  // namespace xloco::outer
