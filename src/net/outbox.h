// Per-peer send queues, shared by both backends: what send() accepted that the peer's link has
// not taken yet. Order is kept per peer, except that urgent messages go first, even between
// two units of a message in transfer (a backend cuts big messages into units: the parts of a
// ZeroMQ stream). A queue is bounded by a byte budget: past it push() refuses (kFull), unless
// the queue is empty, so one message over the budget still goes. A peer keeps only its newest
// kMaxUrgent urgent messages (they are heartbeats: the newest says all). Not thread-safe: each
// transport owns one and uses it from its own thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "net/transport.h"

namespace xloco::net {

class Outbox {
 public:
  static constexpr std::size_t kMaxUrgent = 4;

  struct Item {
    Message message;
    std::size_t bytes = 0;  // the frames' total
    std::size_t taken = 0;  // bytes the backend handed to the link so far
    bool started = false;   // the backend has begun it (a stream's first unit went out)
    std::uint64_t stream = 0;  // the backend's name for it while in transfer (0: none yet)
  };

  SendStatus push(const PeerId& peer, Message message, bool urgent, std::int64_t budget);
  // The next item to move for `peer` (urgent first) or null; `urgent` says which queue.
  Item* front(const PeerId& peer, bool& urgent);
  // The backend handed `bytes` more of the front item to the link; `done` when all of it.
  void advance(const PeerId& peer, bool urgent, std::size_t bytes, bool done);
  // The peer's link was replaced (it reconnected): a message in transfer starts over.
  void restart(const PeerId& peer);
  LinkState state(const PeerId& peer) const;
  void drop(const PeerId& peer);
  std::vector<PeerId> waiting() const;  // peers with something queued

 private:
  using Clock = std::chrono::steady_clock;
  struct Queue {
    std::deque<Item> regular, urgent;
    std::size_t bytes = 0;
    Clock::time_point last_progress{};
  };
  std::map<PeerId, Queue> queues_;
  struct Totals {
    std::uint64_t enqueued = 0, taken = 0;
  };
  std::map<PeerId, Totals> totals_;  // until drop()
};

}  // namespace xloco::net
