#include "outer/round/relay.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "common/text.h"
#include "compress/error.h"
#include "compress/torch_adapter.h"

// Compiled with -ffp-contract=off (CMakeLists.txt): each multiply and subtract below rounds
// once, the same on every machine, so that replicas stay bit-identical.

namespace xloco::outer {
namespace {

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

class Reader {
 public:
  explicit Reader(const net::Frame& f) : f_(f) {}
  template <typename T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, f_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  void need(uint64_t n, const char* what) const {
    XLOCO_FRAME_ENFORCE(n <= f_.size() - pos_, kTruncated,
                        "relayed update header of {} bytes ends at offset {} inside {} ({} bytes needed)",
                        f_.size(), pos_, what, n);
  }
  size_t pos() const { return pos_; }
  void skip(uint64_t n) { pos_ += n; }
  const net::Frame& frame() const { return f_; }

 private:
  const net::Frame& f_;
  size_t pos_ = 0;
};

}  // namespace

namespace {

// Part #i of a relayed update's header, its frame (unless it is the receiver's own) the next
// of u.parts, each field checked before it is used.
RelayPart read_part(Reader& r, uint32_t i, const net::Update& u, size_t& next) {
  RelayPart p;
  const auto name_len = r.get<uint16_t>("a part's name length");
  XLOCO_FRAME_ENFORCE(name_len <= kMaxRelayName, kOverLimit,
                      "relay part #{}: name of {} bytes, limit {}", i, name_len, kMaxRelayName);
  r.need(name_len, "a part's name");
  p.peer.assign(reinterpret_cast<const char*>(r.frame().data() + r.pos()), name_len);
  r.skip(name_len);
  const std::string name = common::printable(p.peer, 64);  // as it may reach a log
  p.weight = r.get<double>("a part's weight");
  XLOCO_FRAME_ENFORCE(std::isfinite(p.weight) && p.weight > 0, kCorrupt,
                      "relay part #{} ('{}'): weight {}", i, name, p.weight);
  p.clip = r.get<float>("a part's clip factor");
  XLOCO_FRAME_ENFORCE(p.clip > 0 && p.clip <= 1, kCorrupt,
                      "relay part #{} ('{}'): clip factor {} outside (0, 1]", i, name, p.clip);
  const auto flags = r.get<uint8_t>("a part's flags");
  XLOCO_FRAME_ENFORCE((flags & ~1u) == 0, kCorrupt, "relay part #{} ('{}'): unknown flags {:#x}",
                      i, name, flags);
  p.own = (flags & 1u) != 0;
  const auto bytes = r.get<uint64_t>("a part's frame size");
  XLOCO_FRAME_ENFORCE(!p.own || bytes == 0, kCorrupt,
                      "relay part #{} ('{}') is left out but carries {} bytes", i, name, bytes);
  if (!p.own) {
    XLOCO_FRAME_ENFORCE(next < u.parts.size(), kTruncated,
                        "relay part #{} ('{}'): the update has {} frames after its header", i,
                        name, u.parts.size());
    p.frame = u.parts[next++];
    XLOCO_FRAME_ENFORCE(p.frame.size() == bytes && bytes > 0, kCorrupt,
                        "relay part #{} ('{}'): {} bytes declared, its frame has {}", i, name,
                        bytes, p.frame.size());
  }
  return p;
}

}  // namespace

RelayRule relay_rule_of(const common::Config& config) {
  return {config.outer.relay_mean, config.outer.relay_clip, trust_region_of(config)};
}

bool is_relay_update(const net::Update& u) {
  return u.payload.size() >= sizeof(kRelayMagic) &&
         std::memcmp(u.payload.data(), kRelayMagic, sizeof(kRelayMagic)) == 0;
}

net::Update write_relay(const RelayBundle& b, const std::string& receiver) {
  net::Update u;
  std::vector<uint8_t> out(kRelayMagic, kRelayMagic + sizeof(kRelayMagic));
  put<uint16_t>(out, kRelayVersion);
  put<uint16_t>(out, 0);
  put<uint32_t>(out, static_cast<uint32_t>(b.parts.size()));
  put<float>(out, b.lr);
  put<double>(out, b.weight_sum);
  put<uint8_t>(out, static_cast<uint8_t>(b.rule.mean));
  put<double>(out, b.rule.clip);
  put<double>(out, b.rule.trust.tau);
  put<double>(out, b.rule.trust.floor);
  for (const RelayPart& p : b.parts) {
    const bool own = p.own || (!receiver.empty() && p.peer == receiver);
    put<uint16_t>(out, static_cast<uint16_t>(p.peer.size()));
    out.insert(out.end(), p.peer.begin(), p.peer.end());
    put<double>(out, p.weight);
    put<float>(out, p.clip);
    put<uint8_t>(out, own ? 1 : 0);
    put<uint64_t>(out, own ? 0 : p.frame.size());
    if (!own) u.parts.push_back(p.frame);  // the received buffer itself
  }
  u.payload = net::Frame(std::move(out));
  return u;
}

RelayBundle read_relay(const net::Update& u) {
  const net::Frame& header = u.payload;
  Reader r(header);
  r.need(sizeof(kRelayMagic), "the magic");
  XLOCO_FRAME_ENFORCE(is_relay_update(u), kBadMagic, "not a relayed update (magic)");
  r.skip(sizeof(kRelayMagic));
  const auto version = r.get<uint16_t>("the version");
  XLOCO_FRAME_ENFORCE(version == kRelayVersion, kBadVersion,
                      "relayed update version {}, this build reads version {}", version,
                      kRelayVersion);
  r.get<uint16_t>("the reserved field");
  const auto count = r.get<uint32_t>("the part count");
  XLOCO_FRAME_ENFORCE(count <= kMaxRelayParts, kOverLimit, "relayed update of {} parts, limit {}",
                      count, kMaxRelayParts);
  RelayBundle b;
  b.lr = r.get<float>("the outer rate");
  b.weight_sum = r.get<double>("the weight sum");
  XLOCO_FRAME_ENFORCE(std::isfinite(b.lr) && b.lr >= 0, kCorrupt,
                      "relayed update: outer rate {} is not a finite rate", b.lr);
  XLOCO_FRAME_ENFORCE(std::isfinite(b.weight_sum) && (count == 0 || b.weight_sum > 0), kCorrupt,
                      "relayed update: weight sum {} for {} parts", b.weight_sum, count);
  const auto mean = r.get<uint8_t>("the relay mean");
  XLOCO_FRAME_ENFORCE(mean <= static_cast<uint8_t>(common::RelayMean::kClipped), kCorrupt,
                      "relayed update: relay mean {} is none of all, present, clipped", mean);
  b.rule.mean = static_cast<common::RelayMean>(mean);
  b.rule.clip = r.get<double>("the relay clip");
  b.rule.trust.tau = r.get<double>("the trust region");
  b.rule.trust.floor = r.get<double>("the trust floor");
  XLOCO_FRAME_ENFORCE(std::isfinite(b.rule.clip) && b.rule.clip >= 0 &&
                          std::isfinite(b.rule.trust.tau) && b.rule.trust.tau >= 0 &&
                          std::isfinite(b.rule.trust.floor) && b.rule.trust.floor >= 0,
                      kCorrupt, "relayed update: relay clip {}, trust region {} (floor {})",
                      b.rule.clip, b.rule.trust.tau, b.rule.trust.floor);
  b.parts.reserve(count);
  size_t next = 0;  // the next of u.parts
  std::set<std::string> names;  // each provider once, so a receiver's own is one part at most
  for (uint32_t i = 0; i < count; ++i) {
    b.parts.push_back(read_part(r, i, u, next));
    XLOCO_FRAME_ENFORCE(names.insert(b.parts.back().peer).second, kCorrupt,
                        "relay part #{} ('{}') names a provider twice", i,
                        common::printable(b.parts.back().peer, 64));
  }
  XLOCO_FRAME_ENFORCE(r.pos() == header.size(), kCorrupt, "{} bytes after the relay header's end",
                      header.size() - r.pos());
  XLOCO_FRAME_ENFORCE(next == u.parts.size(), kCorrupt,
                      "the relayed update carries {} frames, its header names {}", u.parts.size(),
                      next);
  return b;
}

namespace {

float* sized(torch::Tensor& t, int64_t n) {
  if (!t.defined() || t.numel() < n) t = torch::empty({std::max<int64_t>(n, 1)}, torch::kFloat32);
  return t.data_ptr<float>();
}

// Consecutive tensors of `part` whose elements lie in one range of at most `chunk` (a tensor
// larger than that is a span of its own): apply_relay's scratch holds one span at a time.
struct Span {
  compress::TensorSpan tensors;
  int64_t begin = 0, end = 0;  // flat elements
};

std::vector<Span> spans_of(const common::FlatLayout& part, int64_t chunk) {
  std::vector<Span> out;
  for (size_t t = 0; t < part.slots.size(); ++t) {
    const auto& s = part.slots[t];
    Span* last = out.empty() ? nullptr : &out.back();
    if (last != nullptr && s.offset >= last->end && s.offset + s.numel - last->begin <= chunk) {
      last->tensors.last = t + 1;
      last->end = s.offset + s.numel;
    } else {
      out.push_back({{t, t + 1}, s.offset, s.offset + s.numel});
    }
  }
  return out;
}

// What apply_relay works on: the relayed round over `part`, the rule's flags, the span in hand
// and its buffers (the sum, the senders' weight, the credits), indexed from span.begin.
struct RelayPass {
  compress::Decoder& decoder;
  const RelayBundle& b;
  const common::FlatLayout& part;
  std::vector<compress::TensorRef> targets;  // part's names and shapes
  std::vector<compress::TensorRef> into;     // the same, the span's tensors pointing into a
  bool present = false, clipped = false;
  Span span{};
  float* a = nullptr;  // Σ wₖ·xₖ
  float* c = nullptr;  // "present"/"clipped": the senders' weight (then, "clipped", their mean)
  float* e = nullptr;  // "clipped": the credits of those that did not send
};

// f(flat index, x) for each value `p`'s frame carries over the span's tensors, x as the rule
// takes it: its clip factor applied; and done(begin, end) after each of their blocks, in order
// (compress::for_each_value: a topk frame's unsent elements are never visited nor written).
template <class F, class Done>
void for_each_sent(RelayPass& r, const RelayPart& p, F&& f, Done&& done) {
  const float k = p.clip;
  compress::for_each_value(
      r.decoder, p.frame.data(), p.frame.size(), r.part, r.targets,
      [&](int64_t i, float x) {
        if (k != 1.0f) x = k * x;  // clipped to the median norm by the head
        f(i, x);
      },
      done, r.span.tensors);
}

// A frame of weight 1 and no clip, rule "all": a[i] + 1·x is a[i] + x, so the decoder adds the
// span's values straight in (a sparse add), into the span's tensors' places in a.
void add_whole(RelayPass& r, const RelayPart& p) {
  r.decoder.decode_add(p.frame.data(), p.frame.size(), r.into, r.span.tensors);
}

// Pass one over the span, each frame in part order, only the elements it sent: a[i] += w·x
// (adding w·0 where it sent nothing would change nothing: a is never −0), and with
// "present"/"clipped" the senders' weight c[i] += w where x ≠ 0. Returns, "clipped", each
// frame's smallest magnitude sent in each of its blocks times outer.relay_clip `alpha` (0 for a
// block it sent nothing in).
std::vector<std::vector<float>> sum_sent(RelayPass& r, float alpha) {
  std::vector<std::vector<float>> least_sent(r.clipped ? r.b.parts.size() : 0);
  float* a = r.a;
  float* c = r.c;
  const int64_t o = r.span.begin;
  for (size_t q = 0; q < r.b.parts.size(); ++q) {
    const RelayPart& p = r.b.parts[q];
    if (!r.present && p.weight == 1.0 && p.clip == 1.0f) {
      add_whole(r, p);
      continue;
    }
    const auto w = static_cast<float>(p.weight);
    float least = std::numeric_limits<float>::infinity();
    for_each_sent(
        r, p,
        [&](int64_t i, float x) {
          if (!r.present) {
            a[i - o] = a[i - o] + w * x;
            return;
          }
          if (x == 0.0f) return;  // sent as 0: as if not sent
          a[i - o] = a[i - o] + w * x;
          c[i - o] = c[i - o] + w;
          if (r.clipped) least = std::min(least, std::fabs(x));  // "present" needs none
        },
        [&](int64_t, int64_t) {
          if (r.clipped) least_sent[q].push_back(std::isfinite(least) ? alpha * least : 0.0f);
          least = std::numeric_limits<float>::infinity();
        });
  }
  return least_sent;
}

// "clipped": c becomes m, the senders' mean; then each frame that did not send an element is
// credited there with m clipped to its least value sent in that block times the clip: extra =
// Σ_{q not sent} w_q·sign(m)·min(|m|, least_q), in part order. An element none sent has m = 0
// and gets nothing. Which elements a frame sent: its frame walked again, block by block, beside
// the dense walk (where it sent, + 0 would change nothing: e is never −0).
void credit_unsent(RelayPass& r, const std::vector<std::vector<float>>& least_sent,
                   std::vector<int64_t>& sent) {
  const float* a = r.a;
  float* c = r.c;
  float* e = r.e;
  const int64_t o = r.span.begin;
  std::fill(e, e + (r.span.end - o), 0.0f);
  for (int64_t i = 0; i < r.span.end - o; ++i) c[i] = c[i] > 0.0f ? a[i] / c[i] : 0.0f;
  for (size_t q = 0; q < r.b.parts.size(); ++q) {
    const RelayPart& p = r.b.parts[q];
    const auto w = static_cast<float>(p.weight);
    size_t blk = 0;
    sent.clear();
    for_each_sent(
        r, p,
        [&](int64_t i, float x) {
          if (x != 0.0f) sent.push_back(i);
        },
        [&](int64_t lo, int64_t hi) {
          const float f = least_sent[q][blk++];
          // The runs between its sent elements, each a plain loop the compiler vectorizes.
          const auto credit = [&](int64_t from, int64_t to) {
            for (int64_t j = from - o; j < to - o; ++j) {
              e[j] = e[j] + w * std::copysign(std::min(std::fabs(c[j]), f), c[j]);
            }
          };
          int64_t from = lo;
          for (const int64_t i : sent) {
            credit(from, i);
            from = i + 1;
          }
          credit(from, hi);
          sent.clear();
        });
  }
}

// The span's new θ into a: returns the first element that is not finite; with `write` (and
// all finite) θ then takes them. With a trust region, each trained tensor's mean goes to
// `values` first, to be measured and scaled.
std::optional<int64_t> step_span(RelayPass& r, torch::Tensor& theta, const TrustRegion& trust,
                                 RelayBuffers& buf, bool write) {
  float* a = r.a;
  const float* c = r.c;
  const float* e = r.e;
  const int64_t o = r.span.begin;
  const float* t = theta.data_ptr<float>();
  const float lr = r.b.lr;
  const auto sum = static_cast<float>(r.b.weight_sum);
  const int64_t trained = r.part.trained_numel();
  const auto mean_at = [&](int64_t j) {  // the round's mean at span element j
    return r.clipped    ? (a[j] + e[j]) / sum
           : !r.present ? a[j] / sum
           : c[j] > 0.0f ? a[j] / c[j]
                         : 0.0f;
  };
  const bool region = trust.tau > 0;
  float* dv = region ? sized(buf.values, r.span.end - o) : nullptr;
  for (size_t k = r.span.tensors.first; k < r.span.tensors.last; ++k) {
    const auto& s = r.part.slots[k];
    const bool measured = region && s.offset < trained;
    float scale = 1.0f;
    if (measured) {
      for (int64_t i = s.offset; i < s.offset + s.numel; ++i) dv[i - o] = mean_at(i - o);
      const auto v = trust_verdict(dv + (s.offset - o), t + s.offset, s.numel, lr, trust);
      scale = v.scale;
      buf.trust_ratio = std::max(buf.trust_ratio, v.ratio);
      buf.trust_scaled += scale < 1.0f ? 1 : 0;
    }
    for (int64_t i = s.offset; i < s.offset + s.numel; ++i) {
      float d = measured ? dv[i - o] : mean_at(i - o);
      if (scale != 1.0f) d = scale * d;
      // Float buffers (past the trained parameters) take the average, as OuterOptimizer does.
      a[i - o] = i < trained ? t[i] - lr * d : t[i] - d;
    }
    for (int64_t i = s.offset; i < s.offset + s.numel; ++i) {
      if (!std::isfinite(a[i - o])) return i;
    }
  }
  if (!write) return std::nullopt;
  float* out = theta.data_ptr<float>();
  for (size_t k = r.span.tensors.first; k < r.span.tensors.last; ++k) {
    const auto& s = r.part.slots[k];
    std::copy(a + (s.offset - o), a + (s.offset - o) + s.numel, out + s.offset);
  }
  return std::nullopt;
}

// One span, all three steps.
std::optional<int64_t> apply_span(RelayPass& r, torch::Tensor& theta, double clip,
                                  const TrustRegion& trust, RelayBuffers& buf, bool write) {
  const int64_t n = r.span.end - r.span.begin;
  for (size_t t = r.span.tensors.first; t < r.span.tensors.last; ++t) {
    r.into[t].data = r.a + (r.part.slots[t].offset - r.span.begin);
  }
  std::fill(r.a, r.a + n, 0.0f);
  if (r.present) std::fill(r.c, r.c + n, 0.0f);
  const auto least_sent = sum_sent(r, static_cast<float>(clip));
  if (r.clipped) credit_unsent(r, least_sent, buf.sent);
  return step_span(r, theta, trust, buf, write);
}

// Whether every value the step can produce is finite, from each frame's L2 norm (a bound on
// any one of its values), the weights, the rate and θ's largest magnitude, with a wide margin
// for rounding (all in double): then θ can be stepped span by span. Every quantity on the way
// is bounded, not only the mean: a product w·x and the running sum (≤ s = Σ wₖ·clipₖ·‖frameₖ‖),
// the senders' mean (≤ s / w_min), the credits (≤ w_all times that), and θ's new value.
// Otherwise (a huge rate or weight, a weight below float's normal range, values near FLT_MAX)
// each span is computed once without writing first, so that θ is left as it was when any
// value is not finite.
bool surely_finite(const RelayBundle& b, const std::vector<double>& norms, const torch::Tensor& theta,
                   const common::FlatLayout& part, common::RelayMean mean) {
  double s = 0, w_all = 0, w_min = std::numeric_limits<double>::infinity();
  for (size_t q = 0; q < b.parts.size(); ++q) {
    const double w = static_cast<float>(b.parts[q].weight);
    s += w * static_cast<double>(b.parts[q].clip) * norms[q];
    w_all += w;
    w_min = std::min(w_min, w);
  }
  const double sum = static_cast<float>(b.weight_sum);
  const double least = std::numeric_limits<float>::min();
  if (!(w_min >= least && sum >= least)) return false;
  const double senders = s / w_min;  // |a / c|: c holds a sender's weight at least
  const double numerator = mean == common::RelayMean::kClipped ? s + w_all * senders : s;
  const double m = mean == common::RelayMean::kPresent ? senders : numerator / sum;
  double t = 0;
  const float* th = theta.data_ptr<float>();
  for (const auto& slot : part.slots) {
    for (int64_t i = slot.offset; i < slot.offset + slot.numel; ++i) {
      const double v = std::fabs(th[i]);
      if (!(v <= t)) t = v;  // a NaN in θ makes the bound NaN: not sure
    }
  }
  const double step = t + std::max(std::fabs(static_cast<double>(b.lr)), 1.0) * m;
  const double largest = std::max({numerator, senders, m, step});
  return std::isfinite(largest) && largest < 1e30;  // FLT_MAX is 3.4e38
}

}  // namespace

std::optional<int64_t> apply_relay(compress::Decoder& decoder, const RelayBundle& b,
                                   torch::Tensor& theta, const common::FlatLayout& part,
                                   common::RelayMean mean, double clip, RelayBuffers& buf,
                                   const TrustRegion& trust) {
  buf.trust_scaled = 0;
  buf.trust_ratio = 0;
  if (b.parts.empty()) return std::nullopt;
  for (const RelayPart& p : b.parts) {
    XLOCO_FRAME_ENFORCE(!p.frame.empty(), kMismatch,
                        "relay part '{}' has no frame (a receiver's own, not filled in)",
                        common::printable(p.peer, 64));
  }
  const auto targets = compress::refs(part, theta);
  RelayPass r{decoder, b, part, targets, targets};
  // Every frame checked whole before θ is touched: names, shapes, structure, checksum, values.
  std::vector<double> norms;
  for (const RelayPart& p : b.parts) norms.push_back(decoder.norm(p.frame.data(), p.frame.size(), r.targets));
  r.clipped = mean == common::RelayMean::kClipped;
  r.present = mean != common::RelayMean::kAll;  // "present" and "clipped" count senders
  auto spans = spans_of(part, std::max<int64_t>(buf.chunk, 1));
  for (Span& s : spans) s.tensors.checked = true;  // each frame checked whole just above
  int64_t widest = 0;
  for (const Span& s : spans) widest = std::max(widest, s.end - s.begin);
  r.a = sized(buf.acc, widest);
  r.c = r.present ? sized(buf.present, widest) : nullptr;
  r.e = r.clipped ? sized(buf.extra, widest) : nullptr;
  const bool checked = surely_finite(b, norms, theta, part, mean);
  buf.two_pass = !checked;
  if (!checked) {  // a dry run first: θ stays as it was unless every value is finite
    for (const Span& s : spans) {
      r.span = s;
      if (const auto at = apply_span(r, theta, clip, trust, buf, false)) return at;
    }
    buf.trust_scaled = 0;
    buf.trust_ratio = 0;
  }
  for (const Span& s : spans) {
    r.span = s;
    // By the bound (or the dry run), no value is anything but finite here.
    if (const auto at = apply_span(r, theta, clip, trust, buf, true)) return at;
  }
  return std::nullopt;
}

std::optional<int64_t> apply_relay(compress::Decoder& decoder, const RelayBundle& b,
                                   torch::Tensor& theta, const common::FlatLayout& part,
                                   RelayBuffers& buf) {
  return apply_relay(decoder, b, theta, part, b.rule.mean, b.rule.clip, buf, b.rule.trust);
}

}  // namespace xloco::outer
