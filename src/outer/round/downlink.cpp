#include "outer/round/downlink.h"

#include <map>

#include <fmt/format.h>
#include <torch/torch.h>

#include "common/text.h"
#include "compress/encoder.h"
#include "compress/error.h"
#include "compress/torch_adapter.h"
#include "outer/round/outer_opt.h"
#include "outer/round/relay.h"

namespace xloco::outer {

net::Update Downlink::for_peer(const std::string&, const net::Update& u) const { return u; }
void Downlink::sent(uint64_t, const net::Frame&) {}

namespace {

std::int64_t payload_bytes(const common::FlatLayout& layout, const compress::CodecConfig& codec) {
  std::uint64_t payload = 0;
  for (const auto& s : layout.slots) {
    payload += compress::tensor_payload_bytes(codec.codec, static_cast<std::uint64_t>(s.numel),
                                              codec.block_size, codec.topk, codec.topk_bits);
  }
  return static_cast<std::int64_t>(payload);
}

// Each trained tensor's lr·Δₜ scaled into the trust region (aggregate.h), before the step,
// so that the momentum takes the bounded Δ too.
void bound_to_region(const HeadRound& r, const TrustRegion& region, HeadStep& out) {
  if (region.tau <= 0) return;
  torch::Tensor& delta = r.aggregator.delta();
  const int64_t trained = r.layout.trained_numel();
  float* d = delta.data_ptr<float>();
  const float* t = r.theta_true.data_ptr<float>();
  for (const auto& s : r.part.layout.slots) {
    if (s.offset >= trained) continue;
    const auto v = trust_verdict(d + s.offset, t + s.offset, s.numel, r.lr, region);
    out.trust_ratio = std::max(out.trust_ratio, v.ratio);
    if (v.scale == 1.0f) continue;
    ++out.trust_scaled;
    for (int64_t i = s.offset; i < s.offset + s.numel; ++i) d[i] = v.scale * d[i];
  }
}

class Quantized final : public Downlink {
 public:
  explicit Quantized(const common::Config& config)
      : config_(config), enc_(downlink_codec(config.outer)) {}

  bool keeps_frames() const override { return false; }
  std::int64_t max_update_bytes(const common::FlatLayout& layout) const override {
    return payload_bytes(layout, downlink_codec(config_.outer)) + (std::int64_t{1} << 20);
  }

  HeadStep close(const HeadRound& r) override {
    HeadStep out;
    torch::Tensor& delta = r.aggregator.delta();
    if (r.aggregator.added() > 0) {
      bound_to_region(r, trust_region_of(config_), out);
      if (const auto at = r.opt.non_finite_at(r.theta_true, delta, r.part.begin, r.part.end)) {
        const auto& slot = r.layout.slot_at(*at);
        out.discarded = fmt::format(
            "the outer step would make {}[{}] non-finite (Δ there {}, θ {}): round discarded, θ "
            "and the momentum kept",
            slot.name, *at - slot.offset, delta[*at].item<float>(), r.theta_true[*at].item<float>());
      } else {
        r.opt.step(r.theta_true, delta, r.part.begin, r.part.end);
      }
    }
    // The update carries the round's fragment alone; the other fragments' downlink residuals
    // (θ_true − θ_pub there) wait for their own rounds.
    std::vector<uint8_t> frame;
    if (config_.outer.codec_down == common::CodecKind::kFp32) {
      compress::encode(enc_, r.part.layout, r.theta_true, frame);
    } else {
      if (!delta.defined()) delta = torch::empty_like(r.theta_true);
      auto d = delta.narrow(0, r.part.begin, r.part.numel());  // Δ is spent: reuse its memory
      torch::sub_out(d, r.theta_true.narrow(0, r.part.begin, r.part.numel()),
                     r.theta_pub.narrow(0, r.part.begin, r.part.numel()));
      compress::encode(enc_, r.part.layout, delta, frame);
    }
    out.update.payload = net::Frame(std::move(frame));
    return out;
  }

  void apply_to_pub(const net::Update& u, torch::Tensor& theta_pub, const torch::Tensor&,
                    const Fragment& part) override {
    apply_update(dec_, u.payload.data(), u.payload.size(), config_.outer, theta_pub, part.layout);
  }

  std::optional<std::string> take(const net::Update& u, uint64_t r, const std::string&,
                                  torch::Tensor& theta_pub,
                                  const common::FlatLayout& part) override {
    if (!u.parts.empty()) {
      return fmt::format("round {}'s update carries {} relayed frames, but this run's "
                         "outer.downlink is \"quantized\"", r, u.parts.size());
    }
    try {
      apply_update(dec_, u.payload.data(), u.payload.size(), config_.outer, theta_pub, part);
    } catch (const compress::FrameError& e) {
      return fmt::format("round {}'s update does not decode: {}", r, e.what());
    }
    return std::nullopt;
  }

 private:
  const common::Config config_;
  compress::Encoder enc_;
  compress::Decoder dec_;
};

class Relay final : public Downlink {
 public:
  explicit Relay(const common::Config& config) : config_(config) {}

  bool keeps_frames() const override { return true; }
  std::int64_t max_update_bytes(const common::FlatLayout& layout) const override {
    // Up to every provider's uplink frame, each no larger than its payload, and the header.
    return config_.outer.providers * payload_bytes(layout, uplink_codec(config_.outer)) +
           (std::int64_t{1} << 20);
  }

  // θ_true takes the accepted frames as every provider will; no downlink residual, so θ_pub
  // becomes θ_true exactly.
  HeadStep close(const HeadRound& r) override {
    HeadStep out;
    RelayBundle b{static_cast<float>(r.lr), r.aggregator.weight_sum(), {}, relay_rule_of(config_)};
    for (const auto& k : r.aggregator.kept()) b.parts.push_back({k.peer, k.weight, k.frame, false, k.clip});
    if (const auto at = apply_relay(dec_, b, r.theta_true, r.part.layout, buf_)) {
      const auto& slot = r.layout.slot_at(*at);
      out.discarded = fmt::format(
          "the relayed step would make {}[{}] non-finite (θ {}): round discarded, θ kept",
          slot.name, *at - slot.offset, r.theta_true[*at].item<float>());
      b.parts.clear();
    }
    out.trust_scaled = buf_.trust_scaled;
    out.trust_ratio = buf_.trust_ratio;
    out.update = write_relay(b);
    return out;
  }

  net::Update for_peer(const std::string& peer, const net::Update& u) const override {
    const RelayBundle b = read_relay(u);  // the head's own: shares u's frames
    for (const auto& p : b.parts) {
      if (p.peer == peer) return write_relay(b, peer);  // a new header, the same frames
    }
    return u;  // it did not contribute: every frame
  }

  void apply_to_pub(const net::Update&, torch::Tensor& theta_pub, const torch::Tensor& theta_true,
                    const Fragment& part) override {
    // θ_true took the same relay already (close); θ_pub was θ_true before it, so the same
    // arithmetic on the same values gives θ_true's values: copy them.
    theta_pub.narrow(0, part.begin, part.numel()).copy_(theta_true.narrow(0, part.begin, part.numel()));
  }

  void sent(uint64_t r, const net::Frame& frame) override {
    sent_.erase(sent_.begin(), sent_.lower_bound(r > 2 ? r - 2 : 0));
    sent_[r] = frame;
  }

  std::optional<std::string> take(const net::Update& u, uint64_t r, const std::string& self,
                                  torch::Tensor& theta_pub,
                                  const common::FlatLayout& part) override {
    try {
      RelayBundle b = read_relay(u);
      for (RelayPart& p : b.parts) {
        if (!p.own) continue;
        const auto it = sent_.find(r);
        if (p.peer != self || it == sent_.end()) {
          return fmt::format("round {}'s relayed update leaves out {}'s frame, which this "
                             "provider does not hold", r, common::printable(p.peer, 64));
        }
        p.frame = it->second;
      }
      if (const auto at = apply_relay(dec_, b, theta_pub, part, buf_)) {
        return fmt::format("round {}'s relayed update makes element {} non-finite", r, *at);
      }
    } catch (const compress::FrameError& e) {
      return fmt::format("round {}'s relayed update does not decode: {}", r, e.what());
    }
    return std::nullopt;
  }

 private:
  const common::Config config_;
  compress::Decoder dec_;
  RelayBuffers buf_;                      // apply_relay's scratch
  std::map<uint64_t, net::Frame> sent_;   // provider: its last contributions by round
};

}  // namespace

std::unique_ptr<Downlink> make_downlink(const common::Config& config) {
  if (config.outer.downlink == common::Downlink::kRelay) return std::make_unique<Relay>(config);
  return std::make_unique<Quantized>(config);
}

}  // namespace xloco::outer
