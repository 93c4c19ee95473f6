#include "outer/provider/attack.h"

#include <cmath>
#include <sstream>

#include <torch/torch.h>

#include "common/error.h"
#include "common/text.h"

namespace xloco::outer {

std::optional<Attack> attack_for(const char* env, const std::string& name) {
  if (env == nullptr || *env == '\0') return std::nullopt;
  std::stringstream ss(env);
  std::string item;
  std::optional<Attack> found;
  while (std::getline(ss, item, ',')) {
    const auto eq = item.find('=');
    Attack a;
    a.text = eq == std::string::npos ? item : item.substr(eq + 1);
    const auto colon = a.text.find(':');
    const std::string kind = a.text.substr(0, colon);
    bool ok = eq != std::string::npos && eq > 0;
    if (kind == "scale") a.kind = AttackKind::kScale;
    else if (kind == "negate") a.kind = AttackKind::kNegate;
    else if (kind == "zero") a.kind = AttackKind::kZero;
    else if (kind == "noise") a.kind = AttackKind::kNoise;
    else if (kind == "ramp") a.kind = AttackKind::kRamp;
    else ok = false;
    if (ok && a.kind != AttackKind::kZero) {
      try {
        size_t used = 0;
        const std::string f = colon == std::string::npos ? "" : a.text.substr(colon + 1);
        a.factor = std::stod(f, &used);
        ok = used == f.size() && std::isfinite(a.factor) && std::abs(a.factor) <= 1e30;
      } catch (const std::exception&) {
        ok = false;
      }
    }
    XLOCO_ENFORCE(ok, common::ConfigError,
                  "XLOCO_ATTACK: \"{}\" is not NAME=KIND[:FACTOR] with KIND scale, negate, zero, "
                  "noise or ramp (the test device of `make attack`)", common::printable(item, 128));
    if (item.substr(0, eq) == name) found = a;
  }
  return found;
}

torch::Tensor apply_attack(const Attack& a, uint64_t round, const torch::Tensor& delta) {
  switch (a.kind) {
    case AttackKind::kScale: return delta * a.factor;
    case AttackKind::kNegate: return delta * -a.factor;
    case AttackKind::kZero: return torch::zeros_like(delta);
    case AttackKind::kRamp:
      return delta * std::pow(a.factor, static_cast<double>(round > 0 ? round - 1 : 0));
    case AttackKind::kNoise: {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(0x5eed0000 + round);
      auto noise = torch::randn(delta.sizes(), gen, delta.options());
      const double n = noise.norm().item<double>();
      return noise * (n > 0 ? a.factor * delta.norm().item<double>() / n : 0.0);
    }
  }
  return delta;
}

}  // namespace xloco::outer
