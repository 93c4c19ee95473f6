#include "outer/aggregate.h"

#include <torch/torch.h>

#include "compress/error.h"
#include "compress/torch_adapter.h"

namespace xloco::outer {

Aggregator::Aggregator(const common::FlatLayout& layout) : layout_(layout) {}

void Aggregator::begin(std::vector<std::string> order) {
  order_.clear();
  for (auto& p : order) order_.push_back({std::move(p), Slot::kExpected, {}, 0});
  next_ = 0;
  added_ = 0;
  ref_tokens_ = 0;
  weight_sum_ = 0;
}

std::vector<Aggregator::Rejected> Aggregator::add(const std::string& peer, net::Frame frame,
                                                  uint64_t tokens) {
  for (auto& e : order_) {
    if (e.peer != peer || e.slot != Slot::kExpected) continue;
    e.slot = Slot::kHeld;
    e.frame = std::move(frame);
    e.tokens = tokens;
    return drain(false);
  }
  return {{peer, "not expected in this round's aggregation"}};
}

std::vector<Aggregator::Rejected> Aggregator::skip(const std::string& peer) {
  for (auto& e : order_) {
    if (e.peer == peer && e.slot == Slot::kExpected) e.slot = Slot::kDone;
  }
  return drain(false);
}

std::vector<Aggregator::Rejected> Aggregator::finish() {
  auto rejected = drain(true);
  if (added_ > 0) delta_.div_(weight_sum_);
  return rejected;
}

size_t Aggregator::held_bytes() const {
  size_t n = 0;
  for (const auto& e : order_) n += e.slot == Slot::kHeld ? e.frame.size() : 0;
  return n;
}

std::vector<Aggregator::Rejected> Aggregator::drain(bool final_pass) {
  std::vector<Rejected> rejected;
  for (; next_ < order_.size(); ++next_) {
    Entry& e = order_[next_];
    if (e.slot == Slot::kExpected && !final_pass) break;
    if (e.slot == Slot::kHeld) {
      auto r = add_now(e);
      rejected.insert(rejected.end(), r.begin(), r.end());
    }
    e.slot = Slot::kDone;
  }
  return rejected;
}

// Δ accumulates Σ (tokens_i / tokens_first) · deq_i. Providers share H and the batch, so the
// weights are 1 and each frame is decoded straight into Δ: no model-sized decode buffer.
std::vector<Aggregator::Rejected> Aggregator::add_now(Entry& e) {
  const net::Frame frame = std::exchange(e.frame, {});
  const double tokens = static_cast<double>(e.tokens);
  const double w = ref_tokens_ == 0 ? 1.0 : tokens / ref_tokens_;
  // Allocated at the first contribution, by when its provider has received its WELCOME: the
  // head never holds Δ and a full fp32 state in flight at the same time at start-up.
  if (!delta_.defined()) delta_ = torch::empty({layout_.numel}, torch::kFloat32);
  if (added_ == 0) delta_.zero_();
  try {
    if (w == 1.0) {
      decoder_.decode_add(frame.data(), frame.size(), compress::refs(layout_, delta_));
    } else {
      if (!scratch_.defined()) scratch_ = torch::empty_like(delta_);
      decoder_.decode(frame.data(), frame.size(), compress::refs(layout_, scratch_));
      delta_.add_(scratch_, w);
    }
  } catch (const compress::FrameError& ex) {
    return {{e.peer, ex.what()}};
  }
  if (ref_tokens_ == 0) ref_tokens_ = tokens;
  weight_sum_ += w;
  ++added_;
  return {};
}

}  // namespace xloco::outer
