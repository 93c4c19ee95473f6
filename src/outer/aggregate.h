// The head's arithmetic of a round (design §2), with no I/O: the token-weighted pseudo-gradient
// Δ = Σ wᵢ·deq(Qᵢ) / Σ wᵢ, then (outer/global_model.h) the outer step and the downlink frame.
//
// Contributions are added into Δ in one fixed order (aggregation_order: by shard, then name),
// whatever order they arrive in: fp32 addition is not associative, so arrival order would
// otherwise leak into θ and two runs of the same config would differ. A frame that arrives
// before those ahead of it waits, still compressed, until they are in or known not to come;
// the wait costs at most (K − 1) compressed frames of memory, in the worst arrival order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

#include "common/layout.h"
#include "compress/decoder.h"
#include "net/frame.h"

namespace xloco::outer {

class Aggregator {
 public:
  explicit Aggregator(const common::FlatLayout& layout);

  // A contribution whose frame failed to decode when its turn came (corrupt payload,
  // non-finite values): it is not in Δ, and Δ is as it was before it.
  struct Rejected {
    std::string peer;
    std::string reason;
  };

  // Starts a round: `order` lists every provider expected to contribute, in adding order.
  void begin(std::vector<std::string> order);
  // A contribution whose frame structure has been checked against the layout. It is added
  // now if every provider ahead of it has been added or skipped, else it waits.
  [[nodiscard]] std::vector<Rejected> add(const std::string& peer, net::Frame frame,
                                          uint64_t tokens);
  // `peer` will not contribute this round (left, died, or not expected after all).
  [[nodiscard]] std::vector<Rejected> skip(const std::string& peer);
  // Adds whatever still waits (in order, skipping the missing), then divides by Σ wᵢ.
  [[nodiscard]] std::vector<Rejected> finish();

  size_t added() const { return added_; }  // contributions in Δ
  size_t held_bytes() const;               // compressed frames waiting for their turn
  torch::Tensor& delta() { return delta_; }  // Δ after finish(); defined once anything was added

 private:
  enum class Slot { kExpected, kHeld, kDone };
  struct Entry {
    std::string peer;
    Slot slot = Slot::kExpected;
    net::Frame frame;
    uint64_t tokens = 0;
  };
  std::vector<Rejected> drain(bool final_pass);
  std::vector<Rejected> add_now(Entry& e);

  const common::FlatLayout& layout_;
  compress::Decoder decoder_;
  std::vector<Entry> order_;
  size_t next_ = 0;          // first entry not yet added or skipped
  size_t added_ = 0;
  double ref_tokens_ = 0;    // tokens of the first contribution added: weight 1
  double weight_sum_ = 0;
  torch::Tensor delta_;
  torch::Tensor scratch_;    // only for a contribution whose token count differs (lazy)
};

}  // namespace xloco::outer
