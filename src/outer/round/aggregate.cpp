#include "outer/round/aggregate.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "compress/error.h"
#include "compress/torch_adapter.h"
#include "outer/round/pace.h"

namespace xloco::outer {

NormVerdict judge_norm(double norm, std::vector<double> reference, size_t expected, double bound,
                       bool final_pass, bool clip_to_median) {
  if (bound <= 0) return {NormAction::kAccept, "outer.norm_bound is 0: norms are not judged"};
  // Zero (or negative, never measured) norms say nothing of an honest scale: they do not count
  // toward the quorum and cannot pull the median down.
  reference.erase(std::remove_if(reference.begin(), reference.end(),
                                 [](double r) { return !(r > 0) || !std::isfinite(r); }),
                  reference.end());
  const size_t quorum = expected / 2 + 1;
  if (reference.size() < quorum) {
    if (!final_pass) return {NormAction::kWait, "waits for a quorum of norms to compare it with"};
    return {NormAction::kRefuse,
            fmt::format("no quorum to judge it: {} providers' norms, {} needed (more than half of "
                        "the round's {})", reference.size(), quorum, expected)};
  }
  // The lower median: with fewer than half of the norms from a coalition, it is an honest one
  // (one norm per provider, so no provider counts twice).
  const auto mid = reference.begin() + static_cast<std::ptrdiff_t>((reference.size() - 1) / 2);
  std::nth_element(reference.begin(), mid, reference.end());
  const double median = *mid;
  if (clip_to_median && !(norm * bound >= median)) {  // a zero or tiny frame only dilutes Δ
    return {NormAction::kRefuse,
            fmt::format("its norm {:.4g} is under 1/{:g} of the median {:.4g} of {} providers' "
                        "(outer.norm_bound): it would only dilute the round's mean",
                        norm, bound, median, reference.size())};
  }
  if (!(norm <= bound * median)) {  // NaN is refused too
    return {NormAction::kRefuse,
            fmt::format("its norm {:.4g} is {:.3g}× the median {:.4g} of {} providers' (over "
                        "outer.norm_bound {:g})",
                        norm, norm / median, median, reference.size(), bound)};
  }
  if (!clip_to_median || norm <= median) {
    return {NormAction::kAccept, fmt::format("norm {:.4g}, median of {} providers' {:.4g}", norm,
                                             reference.size(), median)};
  }
  return {NormAction::kAccept,
          fmt::format("norm {:.4g} clipped to the median {:.4g} of {} providers' (×{:.3g})", norm,
                      median, reference.size(), median / norm),
          median / norm};
}

TrustVerdict trust_verdict(const float* delta, const float* theta, int64_t n, double lr,
                           const TrustRegion& region) {
  if (!(region.tau > 0) || n <= 0) return {};
  double dd = 0, tt = 0;
  for (int64_t i = 0; i < n; ++i) {
    dd += static_cast<double>(delta[i]) * delta[i];
    tt += static_cast<double>(theta[i]) * theta[i];
  }
  const double step = std::fabs(lr) * std::sqrt(dd);
  const double radius = region.tau * std::sqrt(tt) + region.floor * std::sqrt(static_cast<double>(n));
  if (!(radius > 0)) return {1, 0};
  const double ratio = step / radius;
  if (!(ratio > 1)) return {1, ratio};
  return {static_cast<float>(1 / ratio), ratio};
}

TrustRegion trust_region_of(const common::Config& config) {
  return {config.outer.trust_region, config.inner.lr * config.outer.inner_steps};
}

Aggregator::Aggregator(const common::FlatLayout& layout, double norm_bound, bool keep_frames,
                       bool norm_clip)
    : layout_(layout), norm_bound_(norm_bound), keep_frames_(keep_frames), norm_clip_(norm_clip) {}

void Aggregator::begin(std::vector<std::string> order, uint64_t allowance,
                       const common::FlatLayout* part, size_t part_index, bool reference,
                       const std::set<std::string>& optional) {
  allowance_ = allowance;
  if (reference_) {  // each provider's last accepted norm stands until it has a newer one
    auto& h = history_[part_index_];
    for (size_t i = 0; i < accepted_.size(); ++i) h[accepted_peers_[i]] = accepted_[i];
  }
  accepted_.clear();
  accepted_peers_.clear();
  clipped_.clear();
  scores_.clear();
  kept_.clear();
  part_ = part;
  part_index_ = part_index;
  reference_ = reference;
  order_.clear();
  for (auto& p : order) {
    Entry e;
    e.optional = optional.count(p) > 0;
    e.peer = std::move(p);
    order_.push_back(std::move(e));
  }
  next_ = 0;
  added_ = 0;
  ref_tokens_ = 0;
  weight_sum_ = 0;
}

std::vector<Aggregator::Rejected> Aggregator::add(const std::string& peer, net::Frame frame,
                                                  uint64_t tokens) {
  for (auto& e : order_) {
    if (e.peer != peer || e.slot != Slot::kExpected) continue;
    try {
      e.norm = full_round_norm(decoder_.norm(frame.data(), frame.size()), tokens, allowance_);
    } catch (const compress::FrameError& ex) {
      e.slot = Slot::kDone;  // it will not come again: those behind it need not wait
      e.faulted = true;
      auto rejected = drain(false);
      rejected.insert(rejected.begin(), {peer, ex.what(), net::RefusalCode::kBadFrame});
      return rejected;
    }
    e.slot = Slot::kHeld;
    e.frame = std::move(frame);
    e.tokens = tokens;
    return drain(false);
  }
  return {{peer, "not expected in this round's aggregation", net::RefusalCode::kBadFrame}};
}

std::vector<Aggregator::Rejected> Aggregator::skip(const std::string& peer) {
  for (auto& e : order_) {
    if (e.peer == peer && e.slot == Slot::kExpected) e.slot = Slot::kDone;
  }
  return drain(false);
}

std::vector<Aggregator::Rejected> Aggregator::fault(const std::string& peer) {
  for (auto& e : order_) {
    if (e.peer == peer && e.slot == Slot::kExpected) {
      e.slot = Slot::kDone;
      e.faulted = true;
    }
  }
  return drain(false);
}

size_t Aggregator::quorum_base() const {
  size_t n = 0;
  for (const auto& e : order_) {
    if (e.faulted) continue;
    if (e.optional && !e.norm && !history_norm(e.peer)) continue;  // silent, never accepted
    ++n;
  }
  return n;
}

std::vector<Aggregator::Rejected> Aggregator::finish() {
  auto rejected = drain(true);
  if (added_ > 0 && !keep_frames_) delta_.div_(weight_sum_);
  return rejected;
}

Aggregator::NormHistory Aggregator::norm_history() const {
  NormHistory out = history_;
  if (reference_) {
    for (size_t i = 0; i < accepted_.size(); ++i) out[part_index_][accepted_peers_[i]] = accepted_[i];
  }
  return out;
}

size_t Aggregator::held_bytes() const {
  size_t n = 0;
  for (const auto& e : order_) n += e.slot == Slot::kHeld ? e.frame.size() : 0;
  return n;
}

// Norms are judged once every expected provider has one (this round's, or its last accepted
// one) or at the round's end: the reference is then the same whatever order frames arrived in.
// With outer.norm_clip the clip factor moves with every norm of the reference, so it waits
// for this round's norm of every provider not skipped: a last round's norm standing in for
// one still on its way would make the factors, and θ, depend on the arrival order.
bool Aggregator::norms_known() const {
  bool all_known = true;
  for (const auto& e : order_) {
    all_known = all_known && (norm_clip_ ? e.norm.has_value() || e.slot == Slot::kDone
                                         : e.norm || history_norm(e.peer));
  }
  return all_known;
}

// The norm verdicts of order_[next_, end) first (the reference does not move within a round),
// and with a scorer the score of every contribution they accept, so that each is compared with
// its peers'.
Aggregator::RoundScores Aggregator::judge(size_t end) {
  std::vector<double> changes;
  for (size_t i = next_; i < end; ++i) {
    Entry& e = order_[i];
    if (e.slot != Slot::kHeld) continue;
    e.verdict = judge_norm(*e.norm, reference(), quorum_base(), norm_bound_, true, norm_clip_);
    if (!scorer_ || e.verdict.action != NormAction::kAccept) continue;
    try {
      e.score = scorer_(e.peer, e.frame, static_cast<float>(e.verdict.clip));
      changes.push_back(e.score->change);
    } catch (const compress::FrameError& ex) {
      e.score_error = ex.what();
    }
  }
  RoundScores out{std::nullopt, changes.size()};
  if (score_relative_ > 0 && changes.size() >= 3) {
    const auto mid = changes.begin() + static_cast<std::ptrdiff_t>((changes.size() - 1) / 2);
    std::nth_element(changes.begin(), mid, changes.end());
    if (*mid < 0) out.median_change = *mid;
  }
  return out;
}

// A contribution the norm rule accepted, refused by its score (or its scoring's failure).
std::optional<Aggregator::Rejected> Aggregator::score_refusal(Entry& e, const RoundScores& round) {
  if (e.score_error) {
    e.faulted = true;
    return Rejected{e.peer, *e.score_error, net::RefusalCode::kBadFrame};
  }
  if (!e.score) return std::nullopt;
  const Score& s = *e.score;
  scores_.emplace_back(e.peer, s.change);
  if (s.refuse) return Rejected{e.peer, *s.refuse, net::RefusalCode::kLowScore};
  if (round.median_change && s.change > *round.median_change * (1 - score_relative_)) {
    return Rejected{e.peer,
                    fmt::format("alone it moves the held-out loss by {:+.4g}, a fall of less than "
                                "{:g} × the median {:+.4g} of the round's {} scored "
                                "contributions (outer.score_relative)",
                                s.change, score_relative_, *round.median_change, round.scored),
                    net::RefusalCode::kLowScore};
  }
  return std::nullopt;
}

std::vector<Aggregator::Rejected> Aggregator::drain(bool final_pass) {
  std::vector<Rejected> rejected;
  if (!norms_known() && !final_pass && norm_bound_ > 0) return rejected;
  size_t end = next_;
  while (end < order_.size() && (final_pass || order_[end].slot != Slot::kExpected)) ++end;
  const RoundScores round = judge(end);
  for (; next_ < end; ++next_) {
    Entry& e = order_[next_];
    if (e.slot == Slot::kHeld) {
      const NormVerdict& v = e.verdict;
      if (v.action == NormAction::kRefuse) {
        e.frame = {};
        rejected.push_back({e.peer, v.reason, net::RefusalCode::kOutlier});
      } else {
        const auto clip = static_cast<float>(v.clip);
        if (auto scored = score_refusal(e, round)) {
          e.frame = {};
          e.slot = Slot::kDone;
          rejected.push_back(std::move(*scored));
          continue;
        }
        auto r = add_now(e, clip);
        rejected.insert(rejected.end(), r.begin(), r.end());
        if (r.empty()) {
          // The reference keeps its norm as sent (a clipped norm would drag the median down
          // round after round); a norm over the median is clipped again in every round.
          accepted_.push_back(*e.norm);
          accepted_peers_.push_back(e.peer);
          if (clip < 1.0f) clipped_.emplace_back(e.peer, clip);
        }
      }
    }
    e.slot = Slot::kDone;
  }
  return rejected;
}

std::optional<double> Aggregator::history_norm(const std::string& peer) const {
  const auto h = history_.find(part_index_);
  if (h == history_.end()) return std::nullopt;
  const auto it = h->second.find(peer);
  if (it == h->second.end()) return std::nullopt;
  return it->second;
}

// One norm per provider: this round's if it has arrived (its own included), else its last
// accepted one; providers of earlier rounds that are not expected in this one count by their
// last accepted norm, so a round of few providers is still judged against many.
std::vector<double> Aggregator::reference() const {
  std::vector<double> out;
  std::set<std::string> seen;
  for (const auto& other : order_) {
    seen.insert(other.peer);
    if (other.norm) {
      out.push_back(*other.norm);
    } else if (const auto h = history_norm(other.peer)) {
      out.push_back(*h);
    }
  }
  if (const auto h = history_.find(part_index_); h != history_.end()) {
    for (const auto& [peer, norm] : h->second) {
      if (!seen.count(peer)) out.push_back(norm);
    }
  }
  return out;
}

// Δ accumulates Σ wᵢ · deq_i, wᵢ = contribution_weight (pace.h): tokens over the first's. With
// fixed H the providers share H and the batch, so the weights are 1 and each frame is decoded
// straight into Δ: no model-sized decode buffer. Time-budgeted rounds weigh by work. With
// keep_frames the frame is kept instead (the relay applies it; add() decoded and checked it).
// A clip factor under 1 scales the values, not the weight: the contribution keeps its share of
// Σ wᵢ (the divisor), only smaller.
std::vector<Aggregator::Rejected> Aggregator::add_now(Entry& e, float clip) {
  net::Frame frame = std::exchange(e.frame, {});
  const double w = contribution_weight(e.tokens, ref_tokens_, allowance_);
  if (keep_frames_) {
    kept_.push_back({e.peer, w, std::move(frame), clip});
  } else {
    try {
      add_to_delta(frame, clip == 1.0f ? w : w * static_cast<double>(clip));
    } catch (const compress::FrameError& ex) {
      e.faulted = true;
      return {{e.peer, ex.what(), net::RefusalCode::kBadFrame}};
    }
  }
  if (ref_tokens_ == 0) ref_tokens_ = e.tokens;
  weight_sum_ += w;
  ++added_;
  return {};
}

void Aggregator::add_to_delta(const net::Frame& frame, double w) {
  // Allocated at the first contribution, by when its provider has received its WELCOME: the
  // head never holds Δ and a full fp32 state in flight at the same time at start-up.
  if (!delta_.defined()) delta_ = torch::empty({layout_.numel}, torch::kFloat32);
  if (added_ == 0) delta_.zero_();
  const common::FlatLayout& part = part_ != nullptr ? *part_ : layout_;
  if (w == 1.0) {
    decoder_.decode_add(frame.data(), frame.size(), compress::refs(part, delta_));
  } else {
    add_weighted(frame, part, w);
  }
}

// Δ += w · frame through a buffer of kChunk floats instead of a model-sized one (issue 54: the
// head's memory in a round). The frame's values, block by block, go into the buffer at their
// place in Δ's chunk (zeros elsewhere), and each chunk is added with LibTorch's own add_: chunks
// are aligned multiples of every SIMD width, so every element is rounded exactly as one add_
// over the whole of Δ rounds it (an unsent element adds w · 0). A frame whose tensors are out of
// Δ's order only flushes more often: each element still takes its one value.
void Aggregator::add_weighted(const net::Frame& frame, const common::FlatLayout& part, double w) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  const int64_t n = delta_.numel();
  if (!scratch_.defined()) scratch_ = torch::zeros({std::min(kChunk, n)}, torch::kFloat32);
  float* buf = scratch_.data_ptr<float>();
  int64_t begin = -1;  // Δ's chunk the buffer holds (-1: none)
  auto flush = [&] {
    if (begin < 0) return;
    const int64_t len = std::min(kChunk, n - begin);
    delta_.narrow(0, begin, len).add_(scratch_.narrow(0, 0, len), w);
    std::fill(buf, buf + len, 0.0f);
    begin = -1;
  };
  compress::for_each_value(
      decoder_, frame.data(), frame.size(), part, compress::refs(part, delta_),
      [&](int64_t p, float x) {
        if (begin < 0 || p < begin || p >= begin + kChunk) {
          flush();
          begin = p / kChunk * kChunk;
        }
        buf[p - begin] = x;
      },
      [](int64_t, int64_t) {});
  flush();
}

}  // namespace xloco::outer
