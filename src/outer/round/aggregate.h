// The head's arithmetic of a round (design §2), with no I/O: the token-weighted pseudo-gradient
// Δ = Σ wᵢ·deq(Qᵢ) / Σ wᵢ, then (outer/head/global_model.h) the outer step and the downlink frame.
//
// Contributions are added into Δ in one fixed order (aggregation_order: by shard, then name),
// whatever order they arrive in: fp32 addition is not associative, so arrival order would
// otherwise leak into θ and two runs of the same config would differ. A frame that arrives
// before those ahead of it waits, still compressed, until they are in or known not to come;
// the wait costs at most (K − 1) compressed frames of memory, in the worst arrival order.
//
// A contribution's norm is measured when it arrives (decompressed, never written anywhere) and
// judged (judge_norm) once every provider expected in the round has a norm — this round's, or
// the last one accepted from it — or at the round's end, against the lower median of one norm
// per provider (design §10: its own included, each provider once, zero norms left out): beyond
// outer.norm_bound × that median it is refused; with outer.norm_clip (the default) one under the
// median / norm_bound is refused too (a zero or near-zero frame would only dilute the mean), and
// every accepted one above the median is scaled down to it (its clip factor), so that no
// provider moves θ by more than an honest provider's share however it scales its values. The
// median needs a quorum of more than half of the round's expected providers; without
// one at the round's end, nothing is accepted (the round still closes, θ unchanged, and says
// why). A provider whose frame failed its checks (bad_frame, bad_tokens: no honest provider
// sends one) is not expected any more, and neither is a straggler the round does not wait for
// that has sent nothing this round and has no accepted norm: leaving either out only shrinks a
// coalition's share of those left, while an honest provider that is merely slow keeps its
// place through its last accepted norm. Round 1 (and the first round after a head
// restart) therefore waits for every expected frame or the deadline. A contribution of fewer
// tokens than the round allows (a slower provider under outer.round_budget_s) is judged by its
// norm scaled to a full round (pace.h full_round_norm), and that is the norm its peers are
// compared with. With fewer than half of the providers colluding the median is an honest norm;
// a colluding majority is not covered (design §10).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <torch/types.h>

#include "common/config.h"
#include "common/layout.h"
#include "compress/decoder.h"
#include "net/frame.h"
#include "net/protocol.h"

namespace xloco::outer {

enum class NormAction { kAccept, kWait, kRefuse };
struct NormVerdict {
  NormAction action = NormAction::kAccept;
  std::string reason;
  double clip = 1;  // accepted: the factor its values are scaled by (≤ 1; clip_to_median)
};
// A contribution of norm `norm` against `reference`, one norm per provider (its own included):
// refused beyond `bound` × their lower median (bound 0: never judged). Zero norms do not count.
// With fewer than a quorum (more than half of `expected`, the round's providers) it waits, or at
// the round's end (`final_pass`) is refused: no quorum, no acceptance. With `clip_to_median`
// (outer.norm_clip) a norm under median / bound is refused too, and an accepted norm over the
// median gets clip = median / norm: scaled, it is the median.
NormVerdict judge_norm(double norm, std::vector<double> reference, size_t expected, double bound,
                       bool final_pass, bool clip_to_median = false);

// outer.trust_region: the most one round may move a trained tensor, ‖lr·Δₜ‖ ≤ τ·‖θₜ‖ + floor·√nₜ
// per tensor t (floor: inner.lr × outer.inner_steps, about the most AdamW moves an element from
// zero in a round, so a tensor that starts at zero can move). A pure function, run identically
// on the head and, under relay, on every replica (relay.h): sums in double, in element order.
struct TrustRegion {
  double tau = 0;    // 0: no trust region
  double floor = 0;  // per element
};
struct TrustVerdict {
  float scale = 1;    // Δₜ's factor: 1 within the region, else radius / ‖lr·Δₜ‖
  double ratio = 0;   // ‖lr·Δₜ‖ / radius before scaling (0 with no region)
};
TrustVerdict trust_verdict(const float* delta, const float* theta, int64_t n, double lr,
                           const TrustRegion& region);
// The trust region of `config`'s run (tau 0 when outer.trust_region is 0).
TrustRegion trust_region_of(const common::Config& config);

class Aggregator {
 public:
  // `norm_bound`: outer.norm_bound (0: norms are not judged). `keep_frames`: keep each
  // accepted frame with its weight until the next round (outer.downlink "relay" sends them)
  // *instead of* adding it into Δ: the relay applies the frames themselves (relay.h), so Δ is
  // never computed (delta() stays undefined) and a frame is decoded once on arrival, for its
  // norm and checks (Decoder::norm checks what decode does), not a second time into Δ.
  explicit Aggregator(const common::FlatLayout& layout, double norm_bound = 0,
                      bool keep_frames = false, bool norm_clip = false);

  // A contribution that is not in Δ (and Δ is as it was before it): its frame failed to decode
  // (corrupt payload, non-finite values: kBadFrame), or its norm is an outlier (kOutlier).
  struct Rejected {
    std::string peer;
    std::string reason;
    net::RefusalCode code = net::RefusalCode::kBadFrame;
  };

  // Starts a round: `order` lists every provider expected to contribute, in adding order.
  // `allowance`: the most tokens a contribution's weight counts (round_token_allowance).
  // `part`: the tensors this round's frames carry (outer.fragments: the round's fragment,
  // sync.h; null: the whole layout) and its index, which keeps each fragment's norms apart:
  // a contribution is compared with the last round's of the same fragment. `reference`: false
  // when this round's norms are no guide to that fragment's next round (its first sync, which
  // covers fewer steps than the later ones); they are then not kept.
  // `optional`: those of `order` the round does not wait for (stragglers, RoundState::optional).
  void begin(std::vector<std::string> order, uint64_t allowance = 0,
             const common::FlatLayout* part = nullptr, size_t part_index = 0,
             bool reference = true, const std::set<std::string>& optional = {});
  // A contribution whose frame structure has been checked against the layout. It is added
  // now if every provider ahead of it has been added or skipped, else it waits.
  [[nodiscard]] std::vector<Rejected> add(const std::string& peer, net::Frame frame,
                                          uint64_t tokens);
  // `peer` will not contribute this round (left, died, or not expected after all).
  [[nodiscard]] std::vector<Rejected> skip(const std::string& peer);
  // `peer`'s contribution failed the head's checks before it got here (bad_tokens, bad_frame):
  // as skip, and it no longer counts toward the round's quorum.
  [[nodiscard]] std::vector<Rejected> fault(const std::string& peer);
  // The providers the round's quorum is taken over (judge_norm's `expected`).
  size_t quorum_base() const;
  // Adds whatever still waits (in order, skipping the missing), then divides by Σ wᵢ.
  [[nodiscard]] std::vector<Rejected> finish();

  size_t added() const { return added_; }  // contributions in Δ
  // Norms of the contributions accepted into Δ, in adding order (this round's, until begin()).
  const std::vector<double>& accepted_norms() const { return accepted_; }
  // outer.score: called for each contribution the norm rule accepts, in adding order, before it
  // is added, with its frame and clip factor: the loss change its step alone causes on held-out
  // batches, and a refusal (low_score) when that is over the margin. It may throw
  // compress::FrameError (the contribution is then refused as bad_frame).
  struct Score {
    double change = 0;
    std::optional<std::string> refuse;
  };
  using Scorer = std::function<Score(const std::string& peer, const net::Frame& frame, float clip)>;
  // `relative` (outer.score_relative, 0: off): contributions judged together (every one of the
  // round under norm_clip) are scored first; with 3 or more scores whose lower median m is a
  // fall (m < 0), one whose change is over m − relative × m (it lowers the loss by less than
  // `relative` of m) is refused as low_score too.
  void set_scorer(Scorer scorer, double relative = 0) {
    scorer_ = std::move(scorer);
    score_relative_ = relative;
  }
  // This round's scores (loss change) by provider, in adding order.
  const std::vector<std::pair<std::string, double>>& scores() const { return scores_; }
  // This round's clip factors under 1 (outer.norm_clip), by provider, in adding order.
  const std::vector<std::pair<std::string, double>>& clipped() const { return clipped_; }
  size_t held_bytes() const;               // compressed frames waiting for their turn
  // The norm reference as a checkpoint keeps it: by fragment index, each provider's last
  // accepted norm, this round's included. restore_norm_history puts it back on resume.
  using NormHistory = std::map<size_t, std::map<std::string, double>>;
  NormHistory norm_history() const;
  void restore_norm_history(NormHistory history) { history_ = std::move(history); }
  // With keep_frames: this round's accepted contributions, in adding order, and Σ wᵢ.
  struct Kept {
    std::string peer;
    double weight = 1;
    net::Frame frame;
    float clip = 1;  // its clip factor (judge_norm): the relay scales its values by it
  };
  const std::vector<Kept>& kept() const { return kept_; }
  double weight_sum() const { return weight_sum_; }
  // Δ after finish(); defined once anything was added (never with keep_frames). With a
  // fragment only its tensors hold Δ.
  torch::Tensor& delta() { return delta_; }

 private:
  enum class Slot { kExpected, kHeld, kDone };
  struct Entry {
    std::string peer;
    Slot slot = Slot::kExpected;
    net::Frame frame;
    uint64_t tokens = 0;
    std::optional<double> norm;  // once it has arrived
    bool optional = false;       // a straggler the round does not wait for
    bool faulted = false;        // its frame failed a check: not in the quorum
    NormVerdict verdict;         // once its round's norms are judged (drain)
    std::optional<Score> score;  // with a scorer: its score, or
    std::optional<std::string> score_error;  // why its frame could not be scored (bad_frame)
  };
  std::vector<Rejected> drain(bool final_pass);
  // drain's steps: whether the norms can be judged now; the verdicts and scores of the entries
  // up to `end` (the round's median score change, and how many were scored); and a score's
  // refusal of one the norm rule accepted.
  bool norms_known() const;
  struct RoundScores {
    std::optional<double> median_change;
    size_t scored = 0;
  };
  RoundScores judge(size_t end);
  std::optional<Rejected> score_refusal(Entry& e, const RoundScores& round);
  std::vector<Rejected> add_now(Entry& e, float clip);
  void add_to_delta(const net::Frame& frame, double w);  // throws compress::FrameError
  void add_weighted(const net::Frame& frame, const common::FlatLayout& part, double w);
  std::vector<double> reference() const;  // one norm per provider (judge_norm)
  std::optional<double> history_norm(const std::string& peer) const;

  const common::FlatLayout& layout_;
  const double norm_bound_;
  const bool keep_frames_;
  const bool norm_clip_;
  std::vector<std::pair<std::string, double>> clipped_;
  Scorer scorer_;
  double score_relative_ = 0;
  std::vector<std::pair<std::string, double>> scores_;
  std::vector<Kept> kept_;
  std::vector<double> accepted_;  // this round's accepted norms
  std::vector<std::string> accepted_peers_;  // whose accepted_ are
  // Per fragment, per provider: the norm of its last accepted contribution.
  std::map<size_t, std::map<std::string, double>> history_;
  const common::FlatLayout* part_ = nullptr;  // this round's tensors (null: layout_)
  size_t part_index_ = 0;
  bool reference_ = true;
  compress::Decoder decoder_;
  std::vector<Entry> order_;
  size_t next_ = 0;          // first entry not yet added or skipped
  size_t added_ = 0;
  uint64_t ref_tokens_ = 0;  // tokens of the first contribution added: weight 1
  uint64_t allowance_ = 0;
  double weight_sum_ = 0;
  torch::Tensor delta_;
  torch::Tensor scratch_;    // one chunk of Δ, for a weighted or clipped contribution (lazy)
};

}  // namespace xloco::outer
