// `xloco advise --params N --step-s S[,S...] --link-mbit M[,M...] [--providers K]`: the setting
// (H, codecs, overlap) that keeps every provider busy, from the pure rule in outer/round/advise.h,
// with its predicted utilization, bytes and round time, and the --set flags that make it.
#include <iostream>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include "cli/commands.h"
#include "outer/round/advise.h"

namespace xloco::cli {

void add_advise_command(CLI::App& app) {
  auto in = std::make_shared<outer::AdviseInput>();
  auto* cmd = app.add_subcommand(
      "advise", "predict the setting (H, codecs, overlap) that keeps providers busy on given links");
  cmd->add_option("--params", in->params, "the model's parameters, e.g. 101e6")->required();
  cmd->add_option("--step-s", in->step_s,
                  "each provider's inner step time in seconds (one value: all alike)")
      ->required()
      ->delimiter(',');
  cmd->add_option("--link-mbit", in->link_mbit,
                  "each provider's link rate in Mbit/s, each way (one value: all alike)")
      ->required()
      ->delimiter(',');
  cmd->add_option("--providers", in->providers, "K (default: the longer list)")->check(CLI::Range(1, 4096));
  cmd->add_option("--target", in->target, "utilization to reach (default 0.95)")->check(CLI::Range(0.1, 1.0));
  cmd->add_option("--max-h", in->max_h, "the largest H to advise (default 200)")->check(CLI::Range(1, 100000));
  auto at_h = std::make_shared<int>(0);
  cmd->add_option("--at-h", *at_h,
                  "instead: the predicted utilization, round time and bytes of every setting at "
                  "this H")
      ->check(CLI::Range(1, 100000));
  cmd->callback([in, at_h]() {
    if (*at_h > 0) {
      fmt::print("{:<34} {:>12} {:>10} {:>12} {:>12}\n", "setting at H = " + std::to_string(*at_h),
                 "utilization", "round", "MB up", "MB down");
      for (const auto& [up, down] : {std::pair{"int8", "int8"}, {"topk", "relay"}, {"topk", "int8"}}) {
        for (const bool overlap : {false, true}) {
          const auto p = outer::predict(*in, *at_h, up, down, overlap);
          fmt::print("{:<34} {:>11.1f}% {:>9.1f}s {:>12.2f} {:>12.2f}\n",
                     fmt::format("{}/{}{}", up, down, overlap ? ", overlap" : ""),
                     100 * p.utilization, p.round_s, p.bytes_up / 1e6, p.bytes_down / 1e6);
        }
      }
      return;
    }
    const auto a = outer::advise(*in);
    fmt::print("{}\n\n  H = {}, codec {} up / {} down{}\n  predicted: utilization {:.1f} %, round "
               "{:.1f} s (set by {}), {:.2f} MB up and {:.2f} MB down per provider a round\n\n"
               "  xloco ... {}\n",
               a.reason, a.inner_steps, a.codec_up, a.codec_down,
               a.overlap ? fmt::format(", overlapped rounds (delay_steps {})", a.delay_steps) : "",
               100 * a.utilization, a.round_s, a.slowest, a.bytes_up / 1e6, a.bytes_down / 1e6,
               a.set_flags);
    if (!a.ok) throw CLI::RuntimeError(1);
  });
}

}  // namespace xloco::cli
