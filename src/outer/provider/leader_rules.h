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

// ------------------------------------------------------------------ a restarted provider's state

// What a provider keeps on its own disk at each round boundary (provider.cpp), so that a
// restart loses nothing it had committed: its inner AdamW state and its uplink error-feedback
// residual as they stood right after it sent round `round`'s contribution, which it computed
// from θ_pub(round − 1), whose hash is `base_hash`.
struct SavedProviderState {
  uint64_t round = 0;
  std::string base_hash;
  std::string config_hash;
};

// A saved state is resumed when it continues the run the head (re)joins it to: the same config
// (hash), and the head's last closed round within kMaxStateLag rounds of the state's, either
// way: still in round `round` (its θ_pub then should be `base_hash`, and the contribution sent
// stands), past it by the rounds missed while down, or back by a few rounds because the head
// resumed from an older checkpoint. The moments and the residual carry over as they do across
// any round (DiLoCo carries inner state across θ_pub's jumps); a fresh AdamW state would cost
// every provider a new warm-up. Otherwise it is discarded with the reason: another config, a
// state too old or too far ahead to help. Live providers that receive a full state (after a
// head restart) keep theirs by the same rule (provider.cpp).
inline constexpr uint64_t kMaxStateLag = 2;
struct SavedStateVerdict {
  bool resume = false;
  std::string reason;
};
SavedStateVerdict judge_saved_state(const SavedProviderState& saved, uint64_t head_round,
                                    const std::string& pub_hash, const std::string& config_hash);

}  // namespace xloco::outer
