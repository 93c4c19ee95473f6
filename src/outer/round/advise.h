// `xloco advise` (issue 53, first form): which setting keeps every provider busy, predicted from
// the model's size, each provider's inner step time and link rate, and K. A pure rule: the same
// inputs give the same advice, with its reason and its predictions.
//
// The model of a round (synchronous rounds, the head's close time left out):
//   compute_i = H · step_s_i;  link_i = 8 · (up + down bytes) / (link_mbit_i · 10⁶)
//   no overlap: round = max_i (compute_i + link_i)       utilization = max_i compute_i / round
//   overlap:    round = max_i max(compute_i, link_i)     (the update travels while it trains;
//               delay_steps is set to cover the slowest link, 1.2 × link_i / step_s_i, ≤ H)
// Bytes per parameter, as measured at 101 M parameters (experiments/RESULTS.md, the scale
// rehearsals): int8 ≈ 1.0 up and 1.0 down; topk 176 of 4096 (2 bits) ≈ 0.044 up, and under relay
// (K − 1) × 0.044 down. Options are tried in the order of their measured loss cost (int8 first,
// no overlap first), each at the smallest H of {25, 50, 100, 200, 500} that reaches the target
// utilization; the first option that reaches it at H ≤ max_h wins. Checked against two WAN
// harness runs (experiments/RESULTS.md, "advise"): within 1 point of the measured utilization.
// Providers whose step times differ by more than 1.5× are advised recipe "unequal" (a time
// budget of 0.9 × H × the fastest step time) where the codec is int8.
#pragma once

#include <string>
#include <vector>

namespace xloco::outer {

struct AdviseInput {
  double params = 0;                 // the model's parameters
  std::vector<double> step_s;        // each provider's inner step time (one value: all alike)
  std::vector<double> link_mbit;     // each provider's link rate, each way (one value: all alike)
  int providers = 0;                 // K (0: the longer of the two lists)
  double target = 0.95;              // utilization to reach
  int max_h = 200;                   // the largest H to advise (DiLoCo's loss grows with H)
};

struct Advice {
  bool ok = false;                   // the target is reached at H ≤ max_h
  int inner_steps = 0;               // H
  std::string codec_up, codec_down;  // "int8"/"int8", "topk"/"relay", "topk"/"int8"
  bool overlap = false;              // outer.overlap = "delayed"
  int delay_steps = 0;               // with overlap: steps that hide the slowest link (≤ H)
  double utilization = 0;            // predicted
  double bytes_up = 0, bytes_down = 0;  // per provider and round, predicted
  double round_s = 0;                // predicted round wall time
  std::string slowest;               // the provider that sets the round ("provider-3")
  std::string recipe;                // the recipe this setting is ("lan", "wan", "wan-sparse",
                                     // "unequal"), or "" where none is
  double round_budget_s = 0;         // recipe "unequal": outer.round_budget_s
  std::string reason;                // why this setting, in a sentence
  std::string set_flags;             // the --set flags that make it
};

// Predicted utilization and round time of one setting (the model above).
struct Prediction {
  double utilization = 0, round_s = 0, bytes_up = 0, bytes_down = 0;
  int slowest = 0;  // index of the provider with the longest compute + link
};
Prediction predict(const AdviseInput& in, int inner_steps, const std::string& codec_up,
                   const std::string& codec_down, bool overlap);

Advice advise(const AdviseInput& in);

// The head's advice from what it measured (issue 53): shown in /status, `xloco status` and the
// dashboard while the run's utilization is below the target. Each provider's compute per round
// and the seconds its link took for its last update are measured by the head (ROUND_START to
// CONTRIBUTION less the compute it reports); its link rate is that update's bytes over them.
struct ProviderMeasured {
  std::string name;
  double compute_s = 0;    // inner compute of its last contribution
  double link_s = 0;       // ROUND_START → CONTRIBUTION less compute_s
  double bytes = 0;        // its last contribution's frame
};
struct RunMeasured {
  double utilization = 1;  // mean of the last rounds' compute / round wall
  int rounds = 0;          // rounds that mean is over
  double params = 0;
  int inner_steps = 0;     // H
  std::string codec_up, codec_down;
  std::vector<ProviderMeasured> providers;
};
// "" while the run is at or above the target (or fewer than 2 rounds or no provider measured);
// otherwise one line: the measured utilization, the provider whose link costs most and what a
// recipe would need instead, or, where the links do not explain it, what does.
std::string advise_run(const RunMeasured& m, double target = 0.95);

// Relay's downlink against an aggregated int8 update (experiments/RESULTS.md, issue 54): under
// relay each provider downloads the K − 1 other frames a round, about (K − 1) × the uplink's
// bytes per parameter (topk at 176 of 4096, 2 bits: 0.044; int8 1.0), against 1.0 for an int8
// update. "" while relay downloads less; otherwise the warning the head logs at start, with the
// K where relay stops paying. Pure: (K, the uplink codec, its top-k density).
std::string relay_download_warning(int providers, const std::string& codec_up, int topk,
                                   int block_size);

}  // namespace xloco::outer
