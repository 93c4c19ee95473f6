#include "outer/head/membership.h"

#include "common/text.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "compress/decoder.h"
#include "compress/error.h"
#include "outer/round/pace.h"
#include "outer/round/sync.h"

namespace xloco::outer {

const char* to_string(MemberState state) {
  switch (state) {
    case MemberState::kJoining: return "joining";
    case MemberState::kActive: return "active";
    case MemberState::kStraggling: return "straggling";
    case MemberState::kDead: return "dead";
    case MemberState::kLeft: return "left";
  }
  return "?";
}

size_t live_count(const Members& members) {
  return static_cast<size_t>(std::count_if(members.begin(), members.end(),
                                           [](const auto& m) { return is_live(m.second.state); }));
}

bool is_silent(Clock::time_point now, Clock::time_point last_seen,
               const common::OuterConfig& config) {
  return std::chrono::duration<double>(now - last_seen).count() > config.dead_after_s;
}

SyncAction sync_for(const std::string& provider_hash, const std::string& current_hash,
                    const std::string& previous_hash, bool have_last_update) {
  if (!provider_hash.empty() && provider_hash == current_hash) return SyncAction::kNone;
  if (!provider_hash.empty() && have_last_update && provider_hash == previous_hash) {
    return SyncAction::kUpdate;
  }
  return SyncAction::kFullState;
}

ShardChoice choose_shard(const std::string& peer, int64_t requested, const Members& members,
                         const common::OuterConfig& config) {
  if (config.shared_data) return {0, ""};
  if (const auto it = members.find(peer); it != members.end() && it->second.shard >= 0) {
    return {it->second.shard, requested >= 0 && requested != it->second.shard
                                  ? fmt::format("keeps shard {} from its first join, not {}",
                                                it->second.shard, requested)
                                  : ""};
  }
  std::vector<bool> used(static_cast<size_t>(config.providers), false);
  std::map<int, std::string> holder;
  for (const auto& [name, m] : members) {
    if (m.shard >= 0 && m.shard < config.providers) {
      used[static_cast<size_t>(m.shard)] = true;
      holder[m.shard] = name;
    }
  }
  std::string note;
  if (requested >= 0 && requested < config.providers) {
    if (!used[static_cast<size_t>(requested)]) return {static_cast<int>(requested), ""};
    note = fmt::format("shard {} is {}'s", requested, holder[static_cast<int>(requested)]);
  }
  for (int s = 0; s < config.providers; ++s) {
    if (!used[static_cast<size_t>(s)]) return {s, note};
  }
  return {-1, note};
}

namespace {

// Why a HELLO from a known member is ignored: it died for not keeping up and its back-off has
// not run out, or it repeats a HELLO while its WELCOME is on its way or within
// outer.hello_interval_s of its admission; nullopt when it is not.
std::optional<std::string> repeat_to_ignore(Clock::time_point now, const std::string& peer,
                                            const Member& m, const net::LinkState& link,
                                            const common::OuterConfig& config) {
  if (!is_live(m.state) && now < m.backoff_until) {
    return fmt::format("a HELLO from {}, dead for not keeping up: ignored for {:.0f}s more", peer,
                       std::chrono::duration<double>(m.backoff_until - now).count());
  }
  if (!is_live(m.state) || m.admitted_at == Clock::time_point{}) return std::nullopt;
  const double since = std::chrono::duration<double>(now - m.admitted_at).count();
  if (link.queued_bytes > 0) {
    return fmt::format("a repeated HELLO from {} while {} bytes of its WELCOME are on their way: "
                       "ignored", peer, link.queued_bytes);
  }
  if (since < config.hello_interval_s) {
    return fmt::format("a repeated HELLO from {} {:.1f}s after its admission "
                       "(outer.hello_interval_s {:g}): ignored", peer, since,
                       config.hello_interval_s);
  }
  return std::nullopt;
}

}  // namespace

Admission admit(Clock::time_point now, const std::string& peer, const net::Hello& hello,
                const Members& members, const RunPosition& run, const net::LinkState& link,
                const common::OuterConfig& config) {
  Admission a;
  if (hello.config_hash != run.config_hash) {
    a.code = net::RefusalCode::kConfigHash;
    a.reason = fmt::format("provider {} has config hash {}, the run has {}", peer,
                           common::printable(hello.config_hash, 80), run.config_hash);
    return a;
  }
  if (hello.shard >= config.providers && !config.shared_data) {
    a.code = net::RefusalCode::kBadShard;
    a.reason = fmt::format("provider {} asks for shard {}, but the run has shards 0..{} "
                           "(outer.providers {})",
                           peer, hello.shard, config.providers - 1, config.providers);
    return a;
  }
  const auto it = members.find(peer);
  if (it != members.end()) {
    if (auto reason = repeat_to_ignore(now, peer, it->second, link, config)) {
      a.ignore = true;
      a.reason = std::move(*reason);
      return a;
    }
  }
  const ShardChoice shard = choose_shard(peer, hello.shard, members, config);
  if (shard.shard < 0) {
    a.code = net::RefusalCode::kFull;
    a.reason = fmt::format("all {} shards are taken{}; raise outer.providers", config.providers,
                           shard.note.empty() ? "" : " (" + shard.note + ")");
    return a;
  }
  a.admit = true;
  a.shard = shard.shard;
  a.fresh = it == members.end() || it->second.last_seen == Clock::time_point{};
  a.sync = sync_for(hello.theta_pub_hash, run.pub_hash, run.prev_hash, run.have_last_update);
  if (a.sync == SyncAction::kFullState && it != members.end() && is_live(it->second.state) &&
      it->second.full_state_round &&
      run.done_rounds < *it->second.full_state_round + kFullStateEveryRounds) {
    Admission limited;
    limited.ignore = limited.limited = true;
    limited.reason = fmt::format(
        "a HELLO from {} asking for the full state again at round {}, sent it after round {}: "
        "ignored (at most once in {} rounds for a live provider)",
        peer, run.done_rounds, *it->second.full_state_round, kFullStateEveryRounds);
    return limited;
  }
  const char* how = a.sync == SyncAction::kFullState ? "full state"
                    : a.sync == SyncAction::kUpdate  ? "one round behind: sent the last update"
                                                     : "already current";
  a.reason = fmt::format("{} at round {} ({}), shard {}{}", a.fresh ? "joined" : "rejoined",
                         run.done_rounds, how, shard.shard,
                         shard.note.empty() ? "" : " (" + shard.note + ")");
  return a;
}

ContributionVerdict judge_contribution(const std::string& peer, uint64_t round, uint64_t tokens,
                                       uint64_t allowed_tokens, const Members& members,
                                       const RoundState* open, uint64_t done_rounds,
                                       const std::optional<std::string>& frame_problem) {
  using net::RefusalCode;
  const auto it = members.find(peer);
  if (it == members.end() || !is_live(it->second.state)) {
    return {ContributionAction::kRefuse, RefusalCode::kRejoin, false,
            fmt::format("contribution from {}, which is not a member (never joined, declared "
                        "dead, or the head restarted): send HELLO",
                        peer)};
  }
  const uint64_t current = open ? open->round : done_rounds + 1;
  if (round > current || round == 0) {
    return {ContributionAction::kRefuse, RefusalCode::kFutureRound, false,
            fmt::format("contribution of {} for round {}, but the head is at round {}", peer,
                        round, current)};
  }
  if (open == nullptr || round < open->round) {
    return {ContributionAction::kDrop, RefusalCode::kRejoin, true,
            fmt::format("dropped a contribution from {} for round {} (round {} is {}): late, its "
                        "round has closed",
                        peer, round, current, open ? "open" : "not started")};
  }
  if (open->contributed.count(peer)) {
    return {ContributionAction::kDrop, RefusalCode::kRejoin, true,
            fmt::format("dropped a contribution from {} for round {}: duplicate", peer, round)};
  }
  if (!open->active.count(peer)) {
    return {ContributionAction::kDrop, RefusalCode::kRejoin, false,
            fmt::format("dropped a contribution from {} for round {}: it joined after the round "
                        "started",
                        peer, round)};
  }
  if (tokens == 0) {
    return {ContributionAction::kRefuse, RefusalCode::kBadTokens, false,
            fmt::format("contribution of {} for round {} claims 0 tokens", peer, round)};
  }
  if (tokens > allowed_tokens) {
    return {ContributionAction::kRefuse, RefusalCode::kBadTokens, false,
            fmt::format("contribution of {} for round {} claims {} tokens, the round's schedule "
                        "allows {}",
                        peer, round, tokens, allowed_tokens)};
  }
  if (frame_problem) {
    return {ContributionAction::kRefuse, RefusalCode::kBadFrame, false,
            fmt::format("contribution of {} for round {}: {}", peer, round, *frame_problem)};
  }
  return {ContributionAction::kAccept, RefusalCode::kRejoin, false,
          fmt::format("contribution of {} for round {} ({} tokens)", peer, round, tokens)};
}

std::optional<std::string> frame_mismatch(const compress::FrameInfo& frame,
                                          const common::FlatLayout& layout) {
  if (frame.tensors.size() != layout.slots.size()) {
    return fmt::format("the frame carries {} tensors, the model has {}", frame.tensors.size(),
                       layout.slots.size());
  }
  for (size_t i = 0; i < layout.slots.size(); ++i) {
    const auto& got = frame.tensors[i];
    const auto& want = layout.slots[i];
    if (got.name != want.name || got.shape != want.shape) {
      // got.name is the peer's bytes: escaped and bounded before it enters a refusal.
      return fmt::format("tensor {} is {} [{}], the model's is {} [{}]", i,
                         common::printable(got.name, 96),
                         fmt::join(got.shape, ", "), want.name, fmt::join(want.shape, ", "));
    }
  }
  return std::nullopt;
}

std::optional<std::string> frame_problem(const net::Frame& frame, const common::FlatLayout& layout,
                                         const common::OuterConfig& config) {
  compress::FrameInfo info;
  try {
    info = compress::Decoder().inspect(frame.data(), frame.size());
  } catch (const compress::FrameError& e) {
    return std::string(e.what());
  }
  const compress::Codec want = to_codec(config.codec_up);
  if (info.codec != want) {
    return fmt::format("its codec is {}, the run's outer.codec_up is {}",
                       compress::to_string(info.codec), compress::to_string(want));
  }
  // Every codec's frame carries outer.block_size (the encoder writes it for fp32 and bf16 too),
  // and a relayed frame is walked in its blocks: a block of 1 would cost the relay per element.
  if (info.block_size != static_cast<uint32_t>(config.block_size)) {
    return fmt::format("its block size is {}, the run's outer.block_size is {}", info.block_size,
                       config.block_size);
  }
  const compress::CodecConfig up = uplink_codec(config);
  if (info.topk != up.topk) {
    return fmt::format("it sends {} values per block, the run's outer.topk gives {}", info.topk,
                       up.topk);
  }
  if (info.topk_bits != up.topk_bits) {  // 2 on every frame and config but topk's
    return fmt::format("it sends {}-bit values, the run's outer.topk_bits is {}", info.topk_bits,
                       up.topk_bits);
  }
  return frame_mismatch(info, layout);
}

uint64_t round_token_allowance(const common::Config& config, uint64_t round) {
  const int64_t steps = steps_in_round(round, config);
  const int64_t per_sample =
      config.data.dataset == common::DatasetKind::kFmnist ? 1 : config.model.seq_len;
  return static_cast<uint64_t>(steps) * static_cast<uint64_t>(config.inner.batch_size) *
         static_cast<uint64_t>(per_sample);
}

std::vector<Transition> sweep(Clock::time_point now, const Members& members,
                              const common::OuterConfig& config) {
  std::vector<Transition> out;
  for (const auto& [name, m] : members) {
    if (is_live(m.state) && is_silent(now, m.last_seen, config)) {
      out.push_back({name, MemberState::kDead,
                     fmt::format("silent for {:.1f}s (outer.dead_after_s {:g})",
                                 std::chrono::duration<double>(now - m.last_seen).count(),
                                 config.dead_after_s)});
    }
  }
  return out;
}

std::vector<Transition> stalled(Clock::time_point now, Clock::time_point listening_since,
                                const Members& members,
                                const std::map<std::string, net::LinkState>& links,
                                const common::OuterConfig& config) {
  std::vector<Transition> out;
  for (const auto& [name, link] : links) {
    const auto m = members.find(name);
    if (m == members.end() || !is_live(m->second.state) || link.queued_bytes == 0) continue;
    const double s = std::chrono::duration<double>(now - std::max(link.last_progress, listening_since)).count();
    if (s > config.dead_after_s) {
      out.push_back({name, MemberState::kDead,
                     fmt::format("its link took nothing for {:.1f}s with {} bytes queued "
                                 "(outer.dead_after_s {:g}): it does not keep up",
                                 s, link.queued_bytes, config.dead_after_s),
                     /*backoff=*/true});
    }
  }
  return out;
}

std::vector<Transition> liveness(Clock::time_point now, Clock::time_point listening_since,
                                 const Members& members,
                                 const std::map<std::string, net::LinkState>& links,
                                 const common::OuterConfig& config) {
  auto out = sweep(now, members, config);
  for (auto& t : stalled(now, listening_since, members, links, config)) {
    if (std::none_of(out.begin(), out.end(), [&](const Transition& d) { return d.name == t.name; })) {
      out.push_back(std::move(t));
    }
  }
  return out;
}

Transition failed_send(const std::string& peer, net::SendStatus status) {
  const bool full = status == net::SendStatus::kFull;
  return {peer, MemberState::kDead,
          full ? "its send queue is full: it does not keep up" : "connection lost", full};
}

std::optional<std::string> transition_log(const std::string& name, MemberState from,
                                          const Transition& t) {
  if (from == t.to || (from == MemberState::kJoining && t.to == MemberState::kActive)) {
    return std::nullopt;
  }
  return fmt::format("provider {}: {} -> {} ({})", name, to_string(from), to_string(t.to), t.reason);
}

std::vector<Transition> stragglers(const RoundState& round, const std::string& why) {
  std::vector<Transition> out;
  for (const auto& p : round.active) {
    if (round.contributed.count(p)) continue;
    out.push_back({p, MemberState::kStraggling,
                   fmt::format("missed round {} ({})", round.round, why)});
  }
  return out;
}

Clock::time_point forgiven(Clock::time_point last_seen, Clock::time_point now,
                           Clock::duration gap) {
  if (gap < std::chrono::seconds(1)) return last_seen;
  return std::min(now, last_seen + gap);
}

bool takes_part(const Member& member, const net::LinkState& link) {
  if (!is_live(member.state)) return false;
  return member.state != MemberState::kJoining || link.taken_bytes >= member.welcome_mark;
}

std::vector<std::string> aggregation_order(const RoundState& round, const Members& members) {
  std::vector<std::pair<int, std::string>> keyed;
  for (const auto& name : round.active) {
    const auto it = members.find(name);
    keyed.emplace_back(it == members.end() ? -1 : it->second.shard, name);
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<std::string> out;
  for (auto& k : keyed) out.push_back(std::move(k.second));
  return out;
}

std::vector<ProviderStatus> provider_statuses(const Members& members, Clock::time_point now) {
  std::vector<ProviderStatus> out;
  for (const auto& [name, m] : members) {
    ProviderStatus p;
    p.name = name;
    p.address = m.address;
    p.state = to_string(m.state);
    p.reason = m.reason;
    p.up = is_live(m.state) ? 1 : 0;
    p.shard = m.shard;
    p.last_round = m.last_round;
    p.step = m.step;
    p.tokens = m.tokens;
    p.tokens_per_s = m.tokens_per_s;
    p.bytes_up = m.bytes_up;
    p.bytes_down = m.bytes_down;
    p.score = m.score;
    const double span = std::chrono::duration<double>(m.last_contribution - m.first_contribution).count();
    if (m.first_contribution != Clock::time_point{} && span > 0) {
      p.busy = std::clamp(m.compute_since_first_s / span, 0.0, 1.0);
    }
    p.last_seen_s = m.last_seen == Clock::time_point{}
                        ? -1.0
                        : std::chrono::duration<double>(now - m.last_seen).count();
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace xloco::outer
