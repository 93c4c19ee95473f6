// Membership (design §2) as pure rules over the head's member table, in the style of round.h:
// functions of (now, state, config) that return a verdict and its reason, with no sockets and
// no logging. The head's event loop carries the verdicts out (sends, logs, state changes);
// tests call the rules directly with an injected clock.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/layout.h"
#include "compress/frame.h"
#include "net/protocol.h"
#include "net/transport.h"
#include "outer/round/round.h"
#include "outer/status/documents.h"

namespace xloco::outer {

// A provider is joining from its WELCOME until its first round, active while it contributes,
// straggling after it missed a round's deadline (it is still sent updates and rounds), dead
// when silent for outer.dead_after_s, and left after a BYE.
enum class MemberState { kJoining, kActive, kStraggling, kDead, kLeft };
const char* to_string(MemberState state);
inline bool is_live(MemberState s) {
  return s == MemberState::kJoining || s == MemberState::kActive || s == MemberState::kStraggling;
}

struct Member {
  int shard = -1;                          // its data shard, kept across rejoins
  MemberState state = MemberState::kDead;  // not live until its HELLO
  std::string reason;                      // why it is in that state
  Clock::time_point last_seen{};           // epoch until its first HELLO to this head process
  Clock::time_point admitted_at{};         // its last admission (WELCOME) by this head process
  Clock::time_point backoff_until{};       // dead for not keeping up: its HELLOs wait until then
  uint64_t welcome_mark = 0;               // its link's enqueued bytes once its WELCOME was queued
  uint64_t last_round = 0;                 // last round it contributed to
  uint64_t tokens = 0;                     // contributed over the run
  uint64_t step = 0;                       // from its heartbeats
  double tokens_per_s = 0;                 // from its heartbeats
  double bytes_up = 0, bytes_down = 0;
  double compute_s = 0;                    // inner compute of its last contribution
  double link_s = -1;                      // its last: ROUND_START → CONTRIBUTION less compute_s
  double frame_bytes = 0;                  // its last contribution's frame
  double train_loss = -1;                  // its last contribution's mean training loss (< 0: none)
  // Since its admission: its first and last contributions, and the compute the ones after the
  // first report (its busy share in /status).
  Clock::time_point first_contribution{}, last_contribution{};
  double compute_since_first_s = 0;
  std::string address;                     // IP address of its last HELLO, as the head sees it
  std::deque<double> round_s;              // its recent round times (ROUND_START → CONTRIBUTION)
  // The round after which this head process last sent it θ_pub in full (none: never).
  std::optional<uint64_t> full_state_round;
  std::optional<double> score;             // outer.score: its last contribution's loss change
};
using Members = std::map<std::string, Member>;

inline constexpr std::size_t kRoundTimesKept = 5;
// A live member is sent the full state at most once in this many rounds (design §10): each
// costs the head's uplink fp32 parameter bytes, and a HELLO with an empty θ_pub hash asks for it.
inline constexpr uint64_t kFullStateEveryRounds = 2;

size_t live_count(const Members& members);

// Dead when nothing (heartbeat or any message) came from it for outer.dead_after_s.
bool is_silent(Clock::time_point now, Clock::time_point last_seen,
               const common::OuterConfig& config);

// What a (re)joining provider needs, from the θ_pub hash it reports in HELLO: nothing when it
// holds the head's θ_pub, the last update when it is exactly one round behind (and the head
// still has that update), the full state otherwise (design §2).
enum class SyncAction { kNone, kUpdate, kFullState };
SyncAction sync_for(const std::string& provider_hash, const std::string& current_hash,
                    const std::string& previous_hash, bool have_last_update);

// ------------------------------------------------------------------ admission (HELLO)

// What the head knows of the run when it judges a HELLO.
struct RunPosition {
  std::string config_hash;          // the run's
  uint64_t done_rounds = 0;
  std::string pub_hash, prev_hash;  // θ_pub now, and before the last update
  bool have_last_update = false;
};

struct ShardChoice {
  int shard = -1;      // -1: none free
  std::string note;    // why it is not the one asked for, when it is not
};
// The shard a provider keeps (its earlier one), else the one it asks for when that is free,
// else the lowest free one. Shards follow names, never the order of arrival, so that the same
// config and seed give the same run. shared_data: every provider trains on shard 0.
ShardChoice choose_shard(const std::string& peer, int64_t requested, const Members& members,
                         const common::OuterConfig& config);

struct Admission {
  bool admit = false;
  bool ignore = false;  // neither admitted nor refused: a repeated HELLO, left unanswered
  net::RefusalCode code = net::RefusalCode::kFull;  // when refused
  int shard = -1;
  SyncAction sync = SyncAction::kFullState;
  bool fresh = false;   // its first HELLO to this head process (joined, not rejoined)
  std::string reason;   // refusal, or how it was admitted
  bool limited = false; // ignored by a rate limit (logged, rate-limited itself), not a repeat
};
// `link` is what the head's transport still holds for `peer`. A HELLO repeated while the
// WELCOME of the last one is still queued for the peer, or within outer.hello_interval_s of
// its last admission, is ignored: answering it would queue another state for a link that
// has not taken the first. A live member that was sent the full state less than
// kFullStateEveryRounds rounds ago and asks for it again is ignored too (`limited`): it may ask
// again once the run has moved on, or rejoin from the dead.
Admission admit(Clock::time_point now, const std::string& peer, const net::Hello& hello,
                const Members& members, const RunPosition& run, const net::LinkState& link,
                const common::OuterConfig& config);

// ------------------------------------------------------------------ contributions

enum class ContributionAction {
  kAccept,  // add it to the round's Δ
  kDrop,    // late, duplicate, or from a provider that joined after the round started
  kRefuse,  // answer with an ERROR naming `code`
};
struct ContributionVerdict {
  ContributionAction action = ContributionAction::kRefuse;
  net::RefusalCode code = net::RefusalCode::kRejoin;  // when refused
  bool late = false;                                   // counted in late_contributions
  std::string reason;
};
// `open` is the round in progress, or null between rounds; `done_rounds` the last one closed;
// `allowed_tokens` what the round's schedule lets a provider process (round_token_allowance):
// a claim beyond it is refused, so that no provider can outweigh the others by what it says;
// `frame_problem` what is wrong with the frame's structure (frame_problem()), nullopt when
// nothing is.
ContributionVerdict judge_contribution(const std::string& peer, uint64_t round, uint64_t tokens,
                                       uint64_t allowed_tokens, const Members& members,
                                       const RoundState* open, uint64_t done_rounds,
                                       const std::optional<std::string>& frame_problem);

// The tokens a provider processes in `round` when it follows the schedule: the round's inner
// steps × inner.batch_size × model.seq_len (samples for the CNN). Its ranks split the batch.
uint64_t round_token_allowance(const common::Config& config, uint64_t round);

// A frame's tensor table against the run's layout: nullopt when every name and shape agrees,
// else what differs first.
std::optional<std::string> frame_mismatch(const compress::FrameInfo& frame,
                                          const common::FlatLayout& layout);
// What is wrong with an untrusted contribution's header: unreadable, a codec or block size
// other than the run's outer.codec_up and outer.block_size, or a tensor table other than the
// model's (frame_mismatch). Its payload is not read here: values are checked when the frame is
// decoded.
std::optional<std::string> frame_problem(const net::Frame& frame, const common::FlatLayout& layout,
                                         const common::OuterConfig& config);

// ------------------------------------------------------------------ liveness

struct Transition {
  std::string name;
  MemberState to = MemberState::kDead;
  std::string reason;
  bool backoff = false;  // dead for not keeping up: its HELLOs are ignored for kStallBackoff
};
// How long a member declared dead for not keeping up (a stalled link, a full queue) waits
// before a HELLO of it is answered, in multiples of outer.dead_after_s: so that a peer that
// takes nothing cannot be sent a full state over and over.
inline constexpr double kStallBackoff = 10;
// Live members silent past outer.dead_after_s are dead.
std::vector<Transition> sweep(Clock::time_point now, const Members& members,
                              const common::OuterConfig& config);
// Live members whose link took nothing of what is queued for them for outer.dead_after_s are
// dead: they do not keep up, as a silent one does not answer. The stall counts from
// `listening_since` at the earliest (time the head did not move its queues is not theirs).
std::vector<Transition> stalled(Clock::time_point now, Clock::time_point listening_since,
                                const Members& members,
                                const std::map<std::string, net::LinkState>& links,
                                const common::OuterConfig& config);
// Both rules above: who is dead now, for silence or for a stalled link.
std::vector<Transition> liveness(Clock::time_point now, Clock::time_point listening_since,
                                 const Members& members,
                                 const std::map<std::string, net::LinkState>& links,
                                 const common::OuterConfig& config);
// A send that failed: the peer is gone (kNoPeer), or its queue is full (kFull, with backoff).
Transition failed_send(const std::string& peer, net::SendStatus status);
// At a round's close, the active members that did not contribute are straggling.
std::vector<Transition> stragglers(const RoundState& round, const std::string& why);
// A member silent only because the head could not listen for `gap` (a checkpoint's fsync, a
// long evaluation step) has that time forgiven; gaps under a second are ordinary.
Clock::time_point forgiven(Clock::time_point last_seen, Clock::time_point now,
                           Clock::duration gap);
// The line the head logs for a change of state (none for a joiner's first round).
std::optional<std::string> transition_log(const std::string& name, MemberState from,
                                          const Transition& t);

// Whether a live member takes part in the next round: a joiner only once its link has taken
// its WELCOME (the state must reach it before the round can count on it), whatever was queued
// after it.
bool takes_part(const Member& member, const net::LinkState& link);

// The order in which a round adds its contributions into Δ: by shard, then by name.
std::vector<std::string> aggregation_order(const RoundState& round, const Members& members);

// The member table as /status shows it.
std::vector<ProviderStatus> provider_statuses(const Members& members, Clock::time_point now);

}  // namespace xloco::outer
