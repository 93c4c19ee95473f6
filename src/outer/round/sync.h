// What the head and the providers share about the flat parameter buffer on the wire: the codec
// settings of each link (names and shapes travel in every frame and are checked on decode, so
// a model mismatch is an error, not garbage) and the update rule.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/types.h>

#include "common/config.h"
#include "common/layout.h"
#include "compress/codec.h"
#include "compress/decoder.h"

namespace xloco::outer {

compress::Codec to_codec(common::CodecKind kind);
compress::CodecConfig uplink_codec(const common::OuterConfig& c);
compress::CodecConfig downlink_codec(const common::OuterConfig& c);
compress::CodecConfig full_state_codec();

// θ_pub ← θ_pub + deq(u) for a lossy downlink; θ_pub ← deq(u) = θ_true for fp32, which carries
// θ_true itself so that fp32 on both links keeps θ_pub == θ_true bit for bit (a + (b − a) is
// not always b in floating point). Run identically on the head and every provider.
void apply_update(compress::Decoder& decoder, const uint8_t* frame, size_t size,
                  const common::OuterConfig& c, torch::Tensor& theta_pub,
                  const common::FlatLayout& layout);

// outer.fragments (Streaming DiLoCo, arXiv 2501.18512): the parameter tensors of `layout` cut
// into `count` groups of consecutive whole tensors, each about 1/count of the elements. A
// group's layout holds its slots only, at their offsets in the whole flat buffer (its numel is
// the whole buffer's), so the codec adapter cuts the whole buffer by it and a frame carries
// that group's tensors alone; [begin, end) is the flat range they cover. count 1: the whole
// layout. With count > 1 one more entry follows the groups: the whole layout, which the run's
// last round syncs, so that the final θ_pub holds every group's progress to the last step.
// Throws common::ConfigError when the model has fewer tensors than `count`.
struct Fragment {
  common::FlatLayout layout;
  int64_t begin = 0, end = 0;
  int64_t numel() const { return end - begin; }
};
std::vector<Fragment> split_fragments(const common::FlatLayout& layout, int count);
// The entry of split_fragments(layout, count) that round r (1-based) of `last` syncs:
// group (r − 1) mod count, and in the last round (count > 1) the whole layout (index count).
inline size_t fragment_index(uint64_t round, size_t count, uint64_t last) {
  if (count > 1 && round == last) return count;
  return round == 0 ? 0 : static_cast<size_t>((round - 1) % count);
}
// The same for a run's config: outer.fragments groups, its last round total_rounds.
inline size_t fragment_index(uint64_t round, const common::Config& c) {
  return fragment_index(round, static_cast<size_t>(c.outer.fragments),
                        static_cast<uint64_t>(common::total_rounds(c)));
}

// The uplink / downlink payload sizes that fp32 data parallel would send for the same steps.
inline double fp32_bytes(const torch::Tensor& flat) {
  return static_cast<double>(flat.numel()) * 4.0;
}

}  // namespace xloco::outer
