// The in-process backend of Transport, for tests: a Network of mailboxes in one process, with
// one head and named providers, and the faults of inproc/faults.h. It keeps the ZeroMQ
// backend's contract (send() never waits: each end has an Outbox per peer, moved into the
// peer's mailbox while it has room; kNoPeer for an absent provider; messages shared rather
// than copied) with three differences: no encryption, messages move whole (no chunks, so an
// urgent one passes only messages not yet moved), and a provider's send returns kNoPeer while
// no head listens (ZeroMQ would queue it until one does).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>

#include "net/inproc/faults.h"
#include "net/inproc/options.h"
#include "net/transport.h"

namespace xloco::net::inproc {

class Network : public std::enable_shared_from_this<Network> {
 public:
  static std::shared_ptr<Network> create(NetworkOptions options = {});

  // The head's end; one at a time (a second listen() throws NetError until the first dies).
  std::unique_ptr<Transport> listen();
  // A provider's end, known to the head as `name`; names are unique among live providers.
  std::unique_ptr<Transport> connect(const PeerId& name);

  Faults& faults() noexcept { return faults_; }

 private:
  friend class Endpoint;
  using Clock = std::chrono::steady_clock;

  struct Mailbox {
    struct Item {
      Clock::time_point deliver_at;
      Received received;
    };
    std::deque<Item> items;  // sorted by deliver_at; equal times keep send order
    std::condition_variable changed;
    bool closed = false;
  };

  explicit Network(NetworkOptions options) : options_(options) {}
  std::shared_ptr<Mailbox> open(const PeerId& name);
  // Whether `to` is on the network and, from the head, not cut.
  bool reachable(const PeerId& from, const PeerId& to);
  void close(const PeerId& name);
  // Moves `message` into `to`'s mailbox if it has room: kSent, or kFull (try later), or
  // kNoPeer.
  SendStatus deliver(const PeerId& from, const PeerId& to, const Message& message);
  std::optional<Received> take(const PeerId& name, Mailbox& mailbox,
                               std::chrono::milliseconds timeout, bool pop);

  NetworkOptions options_;
  Faults faults_;
  std::mutex mutex_;
  std::map<PeerId, std::shared_ptr<Mailbox>> mailboxes_;  // kHeadPeer and the providers
};

}  // namespace xloco::net::inproc
