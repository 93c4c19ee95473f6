// What a provider's leader does with each message from the head (design §2), as a pure function
// of what it holds: the provider-side counterpart of membership.h, tested without sockets. The
// leader (provider.cpp) carries the verdict out.
#pragma once

#include <cstdint>
#include <string>

#include "net/protocol.h"

namespace xloco::outer {

struct LeaderState {
  uint64_t done_round = 0;   // the round whose update its θ_pub holds
  bool rejoining = false;    // it sent HELLO to resynchronise and waits for a WELCOME
  uint32_t shard_index = 0;  // the data shard its ranks train on
  uint32_t shard_count = 1;
};

enum class LeaderAction {
  kRunRound,     // ROUND_START of the round after the one it holds: train it
  kApplyUpdate,  // UPDATE closing the round it trained: θ_pub ← θ_pub + deq(u)
  kResync,       // it missed updates, or the head does not know it: HELLO with its θ_pub hash
  kRejoined,     // WELCOME after a resync: take the state it carries, if any, and go on
  kRepeatHello,  // resynchronising, and the head does not know it (it restarted since the
                 // HELLO went): HELLO again, unless one went very recently
  kStop,         // BYE: the run is over (or the head is going away)
  kFatal,        // a refusal that waiting or rejoining cannot cure, or a moved shard
  kReport,       // an ERROR worth a warning, nothing to do
  kIgnore,       // stale, duplicate, already resynchronising, or a heartbeat
};
const char* to_string(LeaderAction action);

struct LeaderVerdict {
  LeaderAction action = LeaderAction::kIgnore;
  std::string reason;
};

LeaderVerdict on_head_message(const LeaderState& state, const net::Envelope& message);

}  // namespace xloco::outer
