// outer.downlink = "relay" (SparseLoCo's all-gather): the head's update is not a requantized
// θ_true − θ_pub but the round's accepted uplink frames themselves, with their weights and the
// update rule. Every replica (the head's θ_true and θ_pub, each provider's θ_pub) applies them
// with the same code in the same order, so the update is exact: θ_pub = θ_true, with no
// downlink residual, and bit-identical everywhere. A provider is sent the frames of the others
// only; its own it kept when it sent it, so each provider receives K − 1 uplink frames a round.
// Outer SGD only (outer.momentum 0): a momentum would have to live on every replica.
//
// An UPDATE of a relayed round is a small header frame and then the frames themselves, each a
// message part of its own: the head sends every provider a selection of the same received
// buffers (no copy, no container around them), so its memory for a round grows as K frames.
// Header (all integers little-endian):
//   "XLRB"  u16 version (3)  u16 reserved (0)  u32 parts  f32 lr  f64 weight_sum
//   u8 relay_mean (0 all, 1 present, 2 clipped)  f64 relay_clip  f64 trust tau  f64 trust floor
//   per part, in the head's aggregation order: u16 name_len, name bytes (the provider),
//     f64 weight, f32 clip (its clip factor, (0, 1]: outer.norm_clip, aggregate.h),
//     u8 flags (bit 0: the frame is left out: it is the receiver's own),
//     u64 frame_bytes (0 when left out; else the size of its message part)
// The parts not left out follow the header as the UPDATE's next frames, in part order. The
// update rule (the rate, the mean, the clip, the trust region) travels in the header and is
// what every replica applies: one source, the head's config, for all of them.
// Below, deq(frameₖ) stands for clipₖ·deq(frameₖ): each replica scales a clipped frame's values
// as the head did, so all apply the same clipped sum (a clip of 1 changes nothing).
// θ ← θ − lr · (Σ wₖ·deq(frameₖ)) / weight_sum, elementwise in float, in part order; with
// relay_mean "present" each element's divisor is instead the weight of the parts whose
// value there is not zero (Σ_{k: deq(frameₖ)ᵢ ≠ 0} wₖ; an element none sent does not move).
// With "clipped" the divisor is weight_sum again, and each part that did not send element i is
// credited there with the senders' mean mᵢ clipped to what it could have held back: its
// smallest sent magnitude in that block times relay_clip (a part's unsent values are
// below the ones it sent), so θ ← θ − lr · (Σ wₖ·deq(frameₖ) + Σ_{k not sent} wₖ·sign(mᵢ)·
// min(|mᵢ|, clip·least_k(block))) / weight_sum. clip 0 is "all", clip ∞ "present".
// With a trust region each trained tensor's lr·(that mean) is then scaled into its trust
// region (aggregate.h trust_verdict), on every replica alike.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "common/config.h"
#include "common/layout.h"
#include "compress/decoder.h"
#include "net/frame.h"
#include "net/protocol.h"
#include "outer/round/aggregate.h"

namespace xloco::outer {

inline constexpr char kRelayMagic[4] = {'X', 'L', 'R', 'B'};
inline constexpr uint16_t kRelayVersion = 3;
inline constexpr uint32_t kMaxRelayParts = net::kMaxUpdateParts;  // more providers than any run has
inline constexpr uint32_t kMaxRelayName = 1024;

struct RelayPart {
  std::string peer;
  double weight = 1;
  net::Frame frame;  // empty when left out (`own`)
  bool own = false;  // the receiver's own contribution: it fills the frame in
  float clip = 1;    // its clip factor: its values are scaled by it
};

// How the relayed frames are combined: every replica takes it from the update.
struct RelayRule {
  common::RelayMean mean = common::RelayMean::kAll;
  double clip = 2;     // relay_mean "clipped": the multiple of a frame's least sent value
  TrustRegion trust;   // tau 0: none
};

struct RelayBundle {
  float lr = 0;
  double weight_sum = 0;
  std::vector<RelayPart> parts;
  RelayRule rule;
};

// The rule of `config`'s run (outer.relay_mean, outer.relay_clip, outer.trust_region).
RelayRule relay_rule_of(const common::Config& config);

bool is_relay_update(const net::Update& u);

// The update as sent to `receiver`: the header with its own part (if any) flagged and left
// out, and the other parts' frames, shared (not copied); "" leaves nothing out (a joiner, or
// the head's own record).
net::Update write_relay(const RelayBundle& b, const std::string& receiver = "");

// Parses an update from another machine: every count and size checked before it is used, the
// frames returned as the update's own (shared) parts. Throws compress::FrameError (kCorrupt /
// kTruncated / kOverLimit / kBadMagic / kBadVersion) naming what is wrong.
RelayBundle read_relay(const net::Update& u);

// Scratch for apply_relay, allocated on first use and kept, each the size of one span of the
// part (consecutive tensors over at most `chunk` elements; a larger tensor is a span of its
// own): the sum; the weight present at each element ("present"; "clipped", where it then
// becomes the senders' mean); the credits of those that did not send ("clipped" only); each
// trained tensor's mean under a trust region; and one block's sent elements ("clipped"). The
// part is worked through span by span, each frame read sparsely over the span's tensors
// (Decoder::for_each_block): no frame is decoded to a dense buffer, nothing is kept per frame
// but its least values, and no buffer is the size of the model (at 101 M parameters and the
// default chunk, a span is 2^24 elements at most: 64 MB a buffer, not 404).
struct RelayBuffers {
  torch::Tensor acc, present, extra, values;
  std::vector<int64_t> sent;
  int64_t chunk = int64_t{1} << 24;  // elements a span holds at most
  int trust_scaled = 0;     // the last apply_relay: tensors its trust region scaled
  double trust_ratio = 0;   // and the largest ‖lr·Δₜ‖ / radius before scaling
  bool two_pass = false;    // and whether it had to compute every span twice (below)
};

// θ ← θ − lr · Σ wₖ·deq(frameₖ) / divisor over `part`'s tensors (the round's fragment): the
// divisor is b.weight_sum (`mean` kAll) or each element's present weight (kPresent); kClipped
// as above, with `clip` (outer.relay_clip; unused otherwise) and each frame's own block size.
// Every frame is checked whole before θ is touched (Decoder::norm with the part's names and
// shapes; "clipped" then walks each frame a second time per span, to credit the elements it did
// not send). A result that is not finite leaves θ as it was and returns where (flat index): θ
// is stepped span by span when a bound from the frames' norms, the weights, the rate and θ's
// largest value shows every result finite (any ordinary round), else each span is first
// computed without writing (`two_pass`). The floats are those of a single pass over the whole
// part, whatever the chunk: each element sees the same operations in the same order. Parts
// flagged `own` must have had their frame filled in.
std::optional<int64_t> apply_relay(compress::Decoder& decoder, const RelayBundle& b,
                                   torch::Tensor& theta, const common::FlatLayout& part,
                                   common::RelayMean mean, double clip, RelayBuffers& buf,
                                   const TrustRegion& trust = {});
// The same with the rule the update carries (b.rule): what the head and the providers call.
std::optional<int64_t> apply_relay(compress::Decoder& decoder, const RelayBundle& b,
                                   torch::Tensor& theta, const common::FlatLayout& part,
                                   RelayBuffers& buf);

}  // namespace xloco::outer
