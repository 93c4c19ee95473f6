// outer.downlink (design §11): how a closed round reaches the providers, chosen once per
// replica from its config; nothing else asks which. "quantized": the head steps θ_true with its
// outer optimizer and sends θ_true − θ_pub requantized by outer.codec_down (θ_true itself for
// fp32; sync.h apply_update). "relay" (relay.h): the head sends the round's accepted uplink
// frames with the update rule, shared rather than copied, and every replica applies them alike.
// The head holds one (close, for_peer, apply_to_pub) and so does each provider leader (sent,
// take).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <torch/types.h>

#include "common/config.h"
#include "common/layout.h"
#include "net/protocol.h"
#include "outer/round/aggregate.h"
#include "outer/round/sync.h"

namespace xloco::outer {

class OuterOptimizer;

// What the head's close_round hands the downlink: the finished aggregator (its Δ, or with
// relay its kept frames), the outer optimizer with its rate set, θ_true and θ_pub, and the
// round's fragment.
struct HeadRound {
  Aggregator& aggregator;
  OuterOptimizer& opt;
  torch::Tensor& theta_true;
  const torch::Tensor& theta_pub;
  const common::FlatLayout& layout;  // the whole model's (for naming where a step failed)
  const Fragment& part;
  double lr = 0;
};
struct HeadStep {
  net::Update update;
  std::optional<std::string> discarded;  // the step would have made θ non-finite: θ kept
  int trust_scaled = 0;                  // trained tensors the trust region scaled
  double trust_ratio = 0;                // the largest ‖lr·Δₜ‖ / radius before scaling
};

class Downlink {
 public:
  virtual ~Downlink() = default;
  // Whether the aggregator keeps the accepted frames (relay) instead of summing them into Δ.
  virtual bool keeps_frames() const = 0;
  // The most bytes one update of this run carries, all its frames together.
  virtual std::int64_t max_update_bytes(const common::FlatLayout& layout) const = 0;

  // Head: θ_true takes the round; returns the update that brings θ_pub after it.
  virtual HeadStep close(const HeadRound& round) = 0;
  // Head: what `peer` is sent of `u` (relay: the same frames, but its own left out).
  virtual net::Update for_peer(const std::string& peer, const net::Update& u) const;
  // Head: θ_pub ← θ_pub + u over `part`, after close() gave u (θ_true has taken the round).
  virtual void apply_to_pub(const net::Update& u, torch::Tensor& theta_pub,
                            const torch::Tensor& theta_true, const Fragment& part) = 0;

  // Provider: its contribution to round r as it went (relay keeps it: the update leaves it out).
  virtual void sent(uint64_t r, const net::Frame& frame);
  // Provider `self`: θ_pub ← round r's update over `part`. nullopt, or why θ_pub was left as it
  // was (a frame that does not decode, a relayed update naming a frame it does not hold, a
  // result that is not finite); a frame that does not decode is reported so, not thrown.
  virtual std::optional<std::string> take(const net::Update& u, uint64_t r,
                                          const std::string& self, torch::Tensor& theta_pub,
                                          const common::FlatLayout& part) = 0;
};

std::unique_ptr<Downlink> make_downlink(const common::Config& config);

}  // namespace xloco::outer
