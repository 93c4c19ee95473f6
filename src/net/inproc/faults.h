// Faults: what the in-process network does wrong on purpose (torchft's fail_at hooks).
// Faults are keyed by provider name and apply to the link between that provider and the
// head. A cut provider is a crashed process or a partition: its messages vanish, the head's
// sends to it return kNoPeer (as ZMQ_ROUTER_MANDATORY reports a lost connection), and it
// receives nothing until healed. Thread-safe; tests arm faults while endpoints run.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>

#include "net/inproc/options.h"
#include "net/protocol.h"
#include "net/transport.h"

namespace xloco::net::inproc {

class Faults {
 public:
  // Silently loses the next `count` messages on the link.
  void drop_next(const PeerId& peer, std::size_t count, Direction direction = Direction::kBoth);
  // Delivers each of the next `count` messages on the link (of `type` only, when given) twice,
  // as a retransmission would.
  void duplicate_next(const PeerId& peer, std::size_t count, Direction direction = Direction::kBoth,
                      std::optional<MessageType> type = std::nullopt);
  // Delivers every later message on the link `delay` after it was sent.
  void delay(const PeerId& peer, std::chrono::milliseconds delay,
             Direction direction = Direction::kBoth);
  // Cuts the provider when it sends its message number `index` (0-based), which is lost.
  void fail_at_message(const PeerId& peer, std::size_t index);
  // Cuts the provider at the first message to or from it whose header round is ≥ `round`
  // (that message is lost): a provider dying during round `round`.
  void fail_at(const PeerId& peer, std::uint64_t round);
  void cut(const PeerId& peer);
  // Rewrites every later message the provider sends through `rewrite` (a compromised or buggy
  // provider: the message is what it returns).
  using Rewrite = std::function<Message(const Message&)>;
  void tamper(const PeerId& peer, Rewrite rewrite);
  // Undoes cut and fail_at*, and clears drops and delays.
  void heal(const PeerId& peer);

  bool is_cut(const PeerId& peer) const;
  std::size_t lost() const;  // messages lost to drops and cuts, for assertions

  // What happens to one message; called by the network for every message.
  struct Verdict {
    bool deliver = true;
    std::chrono::milliseconds delay{0};
    int copies = 1;  // 2 for a duplicated message
    Rewrite rewrite;  // applied to the message before delivery, when set
  };
  Verdict on_message(const PeerId& peer, bool from_peer, const Message& message);

 private:
  struct Link {
    std::size_t drop_from = 0;
    std::size_t drop_to = 0;
    std::size_t duplicate_from = 0;
    std::size_t duplicate_to = 0;
    std::optional<MessageType> duplicate_type;
    std::chrono::milliseconds delay_from{0};
    std::chrono::milliseconds delay_to{0};
    std::optional<std::size_t> fail_at_message;
    std::optional<std::uint64_t> fail_at_round;
    std::size_t sent = 0;  // messages the provider has sent
    bool cut = false;
    Rewrite rewrite;
  };

  mutable std::mutex mutex_;
  std::map<PeerId, Link> links_;
  std::size_t lost_ = 0;
};

}  // namespace xloco::net::inproc
