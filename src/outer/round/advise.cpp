#include "outer/round/advise.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "common/error.h"

namespace xloco::outer {
namespace {

// Bytes per parameter of one frame (measured at 101 M parameters; see advise.h).
constexpr double kInt8Bytes = 1.0;
constexpr double kTopkBytes = 0.044;
constexpr int kGrid[] = {25, 50, 100, 200, 500};

double at(const std::vector<double>& v, int i) {
  return v.size() == 1 ? v[0] : v[static_cast<size_t>(i)];
}

// Seconds provider i's link takes for a round's bytes, up then down.
double link_s(const AdviseInput& in, int i, double bytes_up, double bytes_down) {
  return 8 * (bytes_up + bytes_down) / (at(in.link_mbit, i) * 1e6);
}

// The recipe a setting is (README "Recipes"), or "".
std::string recipe_of(const Advice& a) {
  if (a.codec_up == "int8" && a.codec_down == "int8") return a.overlap ? "wan" : "lan";
  if (a.codec_up == "topk" && a.codec_down == "relay") return "wan-sparse";
  return "";
}

int providers_of(const AdviseInput& in) {
  const int listed = static_cast<int>(std::max(in.step_s.size(), in.link_mbit.size()));
  return in.providers > 0 ? in.providers : listed;
}

void check(const AdviseInput& in) {
  const int k = providers_of(in);
  XLOCO_ENFORCE(in.params > 0 && std::isfinite(in.params), common::ConfigError,
                "advise: --params must be a positive number of parameters");
  XLOCO_ENFORCE(k >= 1 && k <= 4096, common::ConfigError, "advise: {} providers", k);
  for (const auto* list : {&in.step_s, &in.link_mbit}) {
    XLOCO_ENFORCE(list->size() == 1 || static_cast<int>(list->size()) == k, common::ConfigError,
                  "advise: give one value for every provider or one for all ({} providers, {} "
                  "values)", k, list->size());
    for (double v : *list) {
      XLOCO_ENFORCE(v > 0 && std::isfinite(v), common::ConfigError,
                    "advise: step times and link rates must be positive, got {}", v);
    }
  }
}

}  // namespace

Prediction predict(const AdviseInput& in, int inner_steps, const std::string& codec_up,
                   const std::string& codec_down, bool overlap) {
  check(in);
  const int k = providers_of(in);
  Prediction p;
  p.bytes_up = in.params * (codec_up == "topk" ? kTopkBytes : kInt8Bytes);
  p.bytes_down = in.params * (codec_down == "relay"  ? (k - 1) * kTopkBytes
                              : codec_down == "topk" ? kTopkBytes
                                                     : kInt8Bytes);
  double compute = 0, longest = -1;
  for (int i = 0; i < k; ++i) {
    const double c = inner_steps * at(in.step_s, i);
    const double l = link_s(in, i, p.bytes_up, p.bytes_down);
    const double round = overlap ? std::max(c, l) : c + l;
    compute = std::max(compute, c);
    if (round > longest) {
      longest = round;
      p.slowest = i;
    }
  }
  p.round_s = longest;
  p.utilization = longest > 0 ? std::min(1.0, compute / longest) : 0;
  return p;
}

namespace {

struct Option {
  const char *up, *down;
  bool overlap;
};

// The advice of option `o` at H = h, predicted `p`.
Advice advice_for(const AdviseInput& in, bool ok, int h, const Option& o, const Prediction& p) {
  Advice a;
  a.ok = ok;
  a.inner_steps = h;
  a.codec_up = o.up;
  a.codec_down = o.down;
  a.overlap = o.overlap;
  a.utilization = p.utilization;
  a.bytes_up = p.bytes_up;
  a.bytes_down = p.bytes_down;
  a.round_s = p.round_s;
  a.slowest = fmt::format("provider-{}", p.slowest);
  if (o.overlap) {  // the fold waits for the update at delay_steps: the slowest link's steps
    double steps = 0;
    for (int i = 0; i < providers_of(in); ++i) {
      steps = std::max(steps, std::ceil(1.2 * link_s(in, i, p.bytes_up, p.bytes_down) /
                                        at(in.step_s, i)));
    }
    a.delay_steps = static_cast<int>(std::clamp(steps, 1.0, static_cast<double>(h)));
  }
  return a;
}

// The first option, in order, and the smallest H of the grid that reach the target; else the
// best reachable.
Advice choose(const AdviseInput& in, const std::vector<Option>& options) {
  Advice closest;
  double closest_u = -1;
  for (const auto& o : options) {
    for (int h : kGrid) {
      if (h > in.max_h) break;
      const auto p = predict(in, h, o.up, o.down, o.overlap);
      if (p.utilization >= in.target) return advice_for(in, true, h, o, p);
      if (p.utilization > closest_u) {  // the best reachable, should nothing reach the target
        closest_u = p.utilization;
        closest = advice_for(in, false, h, o, p);
      }
    }
  }
  return closest;
}

std::string reason_for(const AdviseInput& in, const Advice& best, bool relay_heavy) {
  const int k = providers_of(in);
  const int h_ref = std::min(50, in.max_h);
  const auto ref = predict(in, h_ref, "int8", "int8", false);
  return fmt::format(
      "{}: with int8 both ways and H = {} provider-{}'s link needs {:.1f} s a round beside "
      "{:.1f} s of compute (utilization {:.0f} %); {} {}/{}{} at H = {}: {:.1f} MB up and "
      "{:.1f} MB down a round per provider, utilization {:.0f} %{}",
      best.ok ? "advice" : "no setting reaches the target",
      h_ref, ref.slowest, link_s(in, ref.slowest, ref.bytes_up, ref.bytes_down),
      h_ref * at(in.step_s, ref.slowest), 100 * ref.utilization,
      best.ok ? "use" : "the closest is", best.codec_up, best.codec_down,
      best.overlap ? " with overlapped rounds" : "", best.inner_steps, best.bytes_up / 1e6,
      best.bytes_down / 1e6, 100 * best.utilization,
      relay_heavy ? fmt::format(" (at K = {} a relayed downlink, {} frames, outweighs an int8 "
                                "update: topk up, int8 down)", k, k - 1)
                  : "");
}

std::string flags_for(const Advice& best) {
  std::string flags = fmt::format("--set outer.inner_steps={} --set outer.codec_up={} --set {}",
                                  best.inner_steps, best.codec_up,
                                  best.codec_down == "relay" ? std::string("outer.downlink=relay")
                                                             : "outer.codec_down=" + best.codec_down);
  if (best.codec_up == "topk") flags += " --set outer.block_size=4096 --set outer.topk=176";
  if (best.codec_down == "relay") {
    flags += " --set outer.momentum=0 --set outer.lr=2.5 --set outer.lr_end=1.25 "
             "--set outer.ef_decay=0.6 --set outer.relay_mean=clipped";
  }
  if (best.overlap) {
    flags += fmt::format(" --set outer.overlap=delayed --set outer.delay_steps={}", best.delay_steps);
  }
  return flags;
}

// The recipe the advice is, or recipe unequal where step times differ by more than 1.5×.
void name_recipe(const AdviseInput& in, Advice& best) {
  best.recipe = recipe_of(best);
  double fastest = at(in.step_s, 0), slowest = fastest;
  for (int i = 0; i < providers_of(in); ++i) {
    fastest = std::min(fastest, at(in.step_s, i));
    slowest = std::max(slowest, at(in.step_s, i));
  }
  if (slowest > 1.5 * fastest && best.codec_up == "int8") {
    best.recipe = "unequal";
    best.round_budget_s = std::round(9 * best.inner_steps * fastest) / 10;
    best.reason += fmt::format(
        "; step times differ {:.1f}x, so the fast providers would idle {:.0f} % of a fixed-H "
        "round: recipe unequal, rounds of {:.1f} s",
        slowest / fastest, 100 * (1 - fastest / slowest), best.round_budget_s);
    best.set_flags += fmt::format(" --set outer.recipe=unequal --set outer.round_budget_s={:g}",
                                  best.round_budget_s);
  } else if (!best.recipe.empty()) {
    best.reason += fmt::format(" (recipe {})", best.recipe);
    // the recipe's other keys (outer rate, momentum, fold) come with it; the keys set beside it win
    best.set_flags += fmt::format(" --set outer.recipe={}", best.recipe);
  }
}

}  // namespace

Advice advise(const AdviseInput& in) {
  check(in);
  // In the order of their measured loss cost: int8 both ways is the reference; overlap costs
  // under 1 % at 20 Mbit/s; the sparse codec 1.009–1.015×; topk up with int8 down is for K past
  // where the relayed downlink outweighs an aggregated one.
  const int k = providers_of(in);
  std::vector<Option> options = {{"int8", "int8", false}, {"int8", "int8", true},
                                 {"topk", "relay", false}, {"topk", "relay", true},
                                 {"topk", "int8", false},  {"topk", "int8", true}};
  const bool relay_heavy = (k - 1) * kTopkBytes > kInt8Bytes;
  if (relay_heavy) {
    std::swap(options[2], options[4]);
    std::swap(options[3], options[5]);
  }
  Advice best = choose(in, options);
  best.reason = reason_for(in, best, relay_heavy);
  best.set_flags = flags_for(best);
  name_recipe(in, best);
  return best;
}

std::string advise_run(const RunMeasured& m, double target) {
  if (m.rounds < 2 || m.utilization >= target || m.providers.empty() || m.params <= 0 ||
      m.inner_steps <= 0) {
    return "";
  }
  AdviseInput in;
  in.params = m.params;
  in.providers = static_cast<int>(m.providers.size());
  in.target = target;
  size_t worst = 0;
  for (size_t i = 0; i < m.providers.size(); ++i) {
    const auto& p = m.providers[i];
    const double link = std::max(p.link_s, 1e-3);
    in.step_s.push_back(std::max(p.compute_s, 1e-3) / m.inner_steps);
    // the update comes back as large as it went: the round's link time is twice the upload
    in.link_mbit.push_back(std::max(8 * p.bytes / link / 1e6, 1e-3));
    if (p.link_s > m.providers[worst].link_s) worst = i;
  }
  const auto& w = m.providers[worst];
  const double round = w.compute_s + 2 * std::max(w.link_s, 0.0);
  if (2 * w.link_s < (1 - target) * round) {
    return fmt::format(
        "utilization {:.0f} %, but the links explain little of it ({}'s takes {:.1f} s of a "
        "{:.1f} s round): the rest is the head (closing rounds, evaluating every "
        "outer.eval_every rounds) or a provider training slower than the others; a larger H "
        "(outer.inner_steps) spreads the head's part thinner",
        100 * m.utilization, w.name, 2 * w.link_s, round);
  }
  const Advice a = advise(in);
  const auto now = predict(in, m.inner_steps, m.codec_up, m.codec_down, false);
  const auto then = predict(in, a.inner_steps, a.codec_up, a.codec_down, a.overlap);
  return fmt::format(
      "utilization {:.0f} %: {}'s link needs {:.1f} s per update ({:.1f} MB up and {:.1f} MB down "
      "at {:.1f} Mbit/s) beside {:.1f} s of compute; {} {}/{}{} at H = {} would need {:.1f} s "
      "(predicted utilization {:.0f} %): {}",
      100 * m.utilization, w.name, link_s(in, static_cast<int>(worst), now.bytes_up, now.bytes_down),
      now.bytes_up / 1e6, now.bytes_down / 1e6, at(in.link_mbit, static_cast<int>(worst)),
      w.compute_s, a.recipe.empty() ? "setting" : "recipe " + a.recipe, a.codec_up, a.codec_down,
      a.overlap ? " overlapped" : "", a.inner_steps,
      link_s(in, static_cast<int>(worst), then.bytes_up, then.bytes_down), 100 * then.utilization,
      a.set_flags);
}

std::string relay_download_warning(int providers, const std::string& codec_up, int topk,
                                   int block_size) {
  double per_frame = 0;  // bytes per parameter of one uplink frame
  if (codec_up == "topk") {
    const int sent = topk > 0 ? topk : std::max(1, block_size / 64);
    per_frame = kTopkBytes * (static_cast<double>(sent) / std::max(1, block_size)) / (176.0 / 4096);
  } else if (codec_up == "int8") {
    per_frame = kInt8Bytes;
  } else if (codec_up == "int4") {
    per_frame = kInt8Bytes / 2;
  } else if (codec_up == "bf16") {
    per_frame = 2;
  } else {
    per_frame = 4;
  }
  const double relayed = (providers - 1) * per_frame;
  if (providers < 2 || relayed <= kInt8Bytes) return "";
  const int break_even = 1 + static_cast<int>(std::floor(kInt8Bytes / per_frame));
  return fmt::format(
      "outer.downlink \"relay\" with K = {}: each provider downloads {} frames a round, about "
      "{:.2f} bytes a parameter, against {:.1f} for an aggregated int8 update; relay is the "
      "smaller downlink only up to K = {} (measured at 101 M parameters, K = 64: 250.7 MB against "
      "about 101 MB; experiments/RESULTS.md, issue 54). Set outer.downlink = \"quantized\" "
      "(outer.codec_down = \"int8\") for fewer bytes",
      providers, providers - 1, relayed, kInt8Bytes, break_even);
}

}  // namespace xloco::outer
