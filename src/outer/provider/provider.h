// A provider of a DiLoCo run (design §1, §2): R ranks in a Gloo group doing the inner steps;
// the leader (rank 0) talks to the head. Per round: take θ_pub, run H inner AdamW steps, send
// Q(δ + e) with δ = θ_pub − θ and keep the residual e, then apply the head's update to θ_pub.
// The other ranks follow the leader through Gloo broadcasts and never touch the network.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/config.h"
#include "inner/dist.h"
#include "net/transport.h"

namespace xloco::outer {

struct ProviderOptions {
  std::string name;       // how logs and metrics name this provider
  std::string run_dir;    // runs/NAME/providers/NAME: metrics
  int64_t shard = -1;     // the data shard to ask the head for (-1: any free one)
  // The warm-start weights the head was started with (`xloco head --init`): the provider
  // builds θ from them, so that joining at the run's start it downloads no state. Empty: θ₀
  // from the run's seed. Weights that are not the head's only cost that download.
  std::string init;
};

// Runs until the head says BYE (or a signal); returns the exit code. `transport` is null on
// every rank but the leader.
int run_provider(const common::Config& config, const ProviderOptions& options,
                 inner::Group& group, std::unique_ptr<net::Transport> transport);

}  // namespace xloco::outer
