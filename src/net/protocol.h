// The wire protocol of design §7, and the only place that defines its messages. A message is
// one JSON header frame {"v":1,"type":…,"run":…,"round":…, type-specific fields} followed by
// the binary frames its type carries (codec frames, state). decode() checks every field of an
// untrusted message and throws a ProtocolError whose kind says what was wrong, never crashes.
// This file knows nothing of rounds' meaning (stale rounds are the outer loop's call).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "net/errors.h"
#include "net/frame.h"

namespace xloco::net {

inline constexpr int kProtocolVersion = 1;
// A header is a few hundred bytes; anything near this is an attack or a bug, and is rejected
// before the JSON parser sees it.
inline constexpr std::size_t kMaxHeaderBytes = 16 * 1024;

// Same order as the alternatives of Body below.
enum class MessageType { kHello, kWelcome, kHeartbeat, kRoundStart, kContribution, kUpdate,
                         kBye, kError };

const char* to_string(MessageType type);  // the wire name: "HELLO", "ROUND_START", …
std::optional<MessageType> parse_message_type(std::string_view name);

enum class ProtocolErrorKind {
  kNoHeader,          // the message has no frames, or an empty header frame
  kHeaderTooLarge,    // header frame over kMaxHeaderBytes
  kNotJson,           // header is not valid JSON
  kNotObject,         // header is JSON but not an object
  kWrongVersion,      // "v" is not kProtocolVersion
  kUnknownType,       // "type" names no message type
  kWrongRun,          // "run" is not the run this end belongs to
  kMissingField,      // a required field is absent
  kBadField,          // a field has the wrong JSON type or is out of range
  kWrongFrameCount,   // the number of binary frames does not match the type
};

const char* to_string(ProtocolErrorKind kind);

// Why a peer refused a message: the "code" of an ERROR, and the only place a refusal code is
// spelled. Peers act on the code (a provider rejoins on kRejoin and gives up on kConfigHash,
// kFull and kBadShard); the reason is for humans.
enum class RefusalCode {
  kMalformed,    // the message failed decode(); the reason names its ProtocolErrorKind
  kConfigHash,   // HELLO with a config hash other than the run's
  kFull,         // HELLO when every data shard is taken
  kBadShard,     // HELLO asking for a data shard the run does not have
  kRejoin,       // a member's message from a non-member (never joined, dead, head restarted)
  kFutureRound,  // CONTRIBUTION for a round that has not started
  kBadFrame,     // CONTRIBUTION whose codec frame does not decode into the run's model
  kBadTokens,    // CONTRIBUTION claiming no tokens, or more than its round's schedule allows
  kOutlier,      // CONTRIBUTION whose norm is far beyond its peers' (outer.norm_bound)
  kLowScore,     // CONTRIBUTION that alone raises the loss on held-out batches (outer.score)
  kUnexpected,   // a message type this end never receives
};
const char* to_string(RefusalCode code);  // the wire name: "config_hash", "rejoin", …
std::optional<RefusalCode> parse_refusal_code(std::string_view name);
// Refusals a provider cannot recover from by waiting or rejoining.
inline bool is_fatal(RefusalCode code) {
  return code == RefusalCode::kConfigHash || code == RefusalCode::kFull ||
         code == RefusalCode::kBadShard;
}

class ProtocolError : public NetError {
 public:
  ProtocolError(ProtocolErrorKind kind, const std::string& what) : NetError(what), kind_(kind) {}
  ProtocolErrorKind kind() const noexcept { return kind_; }

 private:
  ProtocolErrorKind kind_;
};

// Message bodies. The header's run and round live in Envelope, not here.
struct Hello {  // provider → head, on connect and after every reconnect
  std::string provider;     // provider name, for logs and metrics
  std::string config_hash;  // the head refuses a provider whose run config differs
  std::uint64_t tokens = 0; // tokens processed so far (0 for a fresh provider)
  std::string theta_pub_hash;  // BLAKE2b of the θ_pub it holds ("" for none): a provider that
                               // is current needs no state, one round behind only the update
  std::int64_t shard = -1;     // the data shard it asks for (-1: any free one); pinned shards
                               // make a run independent of the order providers connect in
};
struct Welcome {  // head → provider: admission, with the full published state
  Frame state;                    // one binary frame: θ_pub, fp32; empty when the provider's
                                  // θ_pub (Hello.theta_pub_hash) is already the head's
  std::uint32_t shard_index = 0;  // the data shard this provider trains on
  std::uint32_t shard_count = 1;  // shards in the run (K)
};
struct Heartbeat {  // either way, to tell a live idle peer from a dead one
  std::uint64_t step = 0;   // provider → head: its last inner step (status), else 0
  double tokens_per_s = 0;  // provider → head: its recent inner throughput (status), else 0
};
struct RoundStart {};  // head → providers: round `round` starts from the current θ_pub
struct Contribution {  // provider → head: its compressed pseudo-gradient for `round`
  std::uint64_t tokens = 0;  // tokens this provider processed in the round (its weight)
  double compute_s = 0;      // its inner compute time this round (sync-overhead metrics)
  Frame payload;             // one binary codec frame
  double train_loss = -1;    // its mean training loss over the round's steps (the dashboard's
                             // training curve); < 0: not reported (a provider before it)
};
// An UPDATE's frames after its first: a relayed round's uplink frames (outer/round/relay.h).
inline constexpr std::size_t kMaxUpdateParts = 4096;
struct Update {   // head → providers: the compressed outer update closing `round`
  Frame payload;  // one binary codec frame, or a relayed round's header (outer/round/relay.h)
  std::vector<Frame> parts;  // a relayed round: the frames its header names, each shared
  std::size_t bytes() const noexcept {
    std::size_t n = payload.size();
    for (const auto& f : parts) n += f.size();
    return n;
  }
  bool empty() const noexcept { return payload.empty(); }
};
struct Bye {  // either way, before leaving on purpose
  std::string reason;
};
struct ErrorReply {  // either way: why the last message was refused
  RefusalCode code = RefusalCode::kMalformed;
  std::string reason;  // for humans
};

using Body = std::variant<Hello, Welcome, Heartbeat, RoundStart, Contribution, Update, Bye,
                          ErrorReply>;

struct Envelope {
  std::string run;          // run id; a message for another run is refused
  std::uint64_t round = 0;  // the round the message belongs to (0 before the first)
  Body body;

  MessageType type() const noexcept { return static_cast<MessageType>(body.index()); }
};

// Header frame plus the body's binary frames (shared, not copied).
Message encode(const Envelope& envelope);

// Checks and decodes an untrusted message; throws ProtocolError.
Envelope decode(const Message& message, std::string_view expected_run);

// The header's round if it has a readable one; nullopt otherwise. Never throws: for routing
// and fault injection, not for trusting the message.
std::optional<std::uint64_t> peek_round(const Message& message) noexcept;
std::optional<MessageType> peek_type(const Message& message) noexcept;

}  // namespace xloco::net
