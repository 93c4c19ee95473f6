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
// utilization; the first option that reaches it at H ≤ max_h wins. The predictions are not yet
// checked against a WAN run: RESULTS says so until they are.
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

}  // namespace xloco::outer
