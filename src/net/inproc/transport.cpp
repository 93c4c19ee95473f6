#include "net/inproc/transport.h"

#include <algorithm>

#include "net/errors.h"
#include "net/outbox.h"

namespace xloco::net::inproc {

namespace {

using Clock = std::chrono::steady_clock;
// While a send queue waits on a full mailbox, receive() and poll() look again this often.
constexpr std::chrono::milliseconds kPumpInterval{5};

bool over_limit(const Message& message, const TransportLimits& limits) {
  if (limits.max_frames >= 0 && message.size() > static_cast<std::uint64_t>(limits.max_frames)) {
    return true;
  }
  if (limits.max_frame_bytes < 0) return false;
  for (const Frame& f : message) {
    if (f.size() > static_cast<std::uint64_t>(limits.max_frame_bytes)) return true;
  }
  return false;
}

}  // namespace

// One end of the network: the head (name kHeadPeer) or a provider.
class Endpoint final : public Transport {
 public:
  Endpoint(std::shared_ptr<Network> network, PeerId name,
           std::shared_ptr<Network::Mailbox> mailbox)
      : network_(std::move(network)), name_(std::move(name)), mailbox_(std::move(mailbox)) {}
  ~Endpoint() override { network_->close(name_); }

  SendStatus send(const PeerId& peer, const Message& message,
                  const SendOptions& options) override {
    XLOCO_ENFORCE(!message.empty(), NetError, "cannot send a message without frames");
    XLOCO_ENFORCE(name_ == kHeadPeer || peer == kHeadPeer, NetError,
                  "a provider can only send to \"{}\", not \"{}\"", kHeadPeer, peer);
    if (!network_->reachable(name_, peer)) {
      outbox_.drop(peer);
      return SendStatus::kNoPeer;
    }
    const SendStatus status = outbox_.push(peer, message, options.urgent, limits_.queue_bytes);
    if (status != SendStatus::kSent) return status;
    return pump(peer) ? SendStatus::kSent : SendStatus::kNoPeer;
  }
  std::optional<Received> receive(std::chrono::milliseconds timeout) override {
    for (const auto deadline = Clock::now() + timeout;;) {
      auto received = take(deadline, /*pop=*/true);
      if (received && !over_limit(received->message, limits_)) return received;
      if (!received) return std::nullopt;
    }
  }
  bool poll(std::chrono::milliseconds timeout) override {
    return take(Clock::now() + timeout, /*pop=*/false).has_value();
  }
  std::string endpoint() const override { return "inproc://" + kHeadPeer; }
  LinkState link_state(const PeerId& peer) const override { return outbox_.state(peer); }
  void drop_queue(const PeerId& peer) override { outbox_.drop(peer); }
  void set_limits(const TransportLimits& limits) override { limits_ = limits; }

 private:
  // Moves `peer`'s queue into its mailbox while there is room; false when the peer is gone.
  bool pump(const PeerId& peer) {
    for (;;) {
      bool urgent = false;
      Outbox::Item* item = outbox_.front(peer, urgent);
      if (item == nullptr) return true;
      const SendStatus status = network_->deliver(name_, peer, item->message);
      if (status == SendStatus::kFull) return true;
      if (status == SendStatus::kNoPeer) {
        outbox_.drop(peer);
        return false;
      }
      outbox_.advance(peer, urgent, item->bytes, true);
    }
  }
  void pump_all() {
    for (const PeerId& peer : outbox_.waiting()) (void)pump(peer);
  }
  // Waits for a message until `deadline`, moving the outbox on every kPumpInterval meanwhile.
  std::optional<Received> take(Clock::time_point deadline, bool pop) {
    for (;;) {
      pump_all();
      const auto left = std::max(std::chrono::milliseconds(0),
                                 std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
      const auto wait = outbox_.waiting().empty() ? left : std::min(left, kPumpInterval);
      if (auto got = network_->take(name_, *mailbox_, wait, pop)) return got;
      if (Clock::now() >= deadline) return std::nullopt;
    }
  }

  std::shared_ptr<Network> network_;
  PeerId name_;
  std::shared_ptr<Network::Mailbox> mailbox_;
  Outbox outbox_;
  TransportLimits limits_;
};

std::shared_ptr<Network> Network::create(NetworkOptions options) {
  XLOCO_ENFORCE(options.queue_capacity > 0, NetError, "queue_capacity must be positive");
  return std::shared_ptr<Network>(new Network(options));
}

std::unique_ptr<Transport> Network::listen() {
  return std::make_unique<Endpoint>(shared_from_this(), kHeadPeer, open(kHeadPeer));
}

std::unique_ptr<Transport> Network::connect(const PeerId& name) {
  XLOCO_ENFORCE(!name.empty() && name != kHeadPeer, NetError,
                "a provider needs a name other than \"{}\"", kHeadPeer);
  return std::make_unique<Endpoint>(shared_from_this(), name, open(name));
}

std::shared_ptr<Network::Mailbox> Network::open(const PeerId& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, added] = mailboxes_.emplace(name, std::make_shared<Mailbox>());
  XLOCO_ENFORCE(added, NetError, "\"{}\" is already on this network", name);
  return it->second;
}

void Network::close(const PeerId& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = mailboxes_.find(name);
  if (it == mailboxes_.end()) return;
  it->second->closed = true;
  it->second->changed.notify_all();  // wakes senders blocked on its capacity
  mailboxes_.erase(it);
}

bool Network::reachable(const PeerId& from, const PeerId& to) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!mailboxes_.count(to)) return false;
  return from != kHeadPeer || !faults_.is_cut(to);
}

SendStatus Network::deliver(const PeerId& from, const PeerId& to, const Message& message) {
  const bool from_provider = from != kHeadPeer;
  const PeerId& provider = from_provider ? from : to;
  std::unique_lock<std::mutex> lock(mutex_);
  const auto it = mailboxes_.find(to);
  if (it == mailboxes_.end()) return SendStatus::kNoPeer;
  if (!from_provider && faults_.is_cut(to)) return SendStatus::kNoPeer;
  const std::shared_ptr<Mailbox> mailbox = it->second;
  if (mailbox->items.size() >= options_.queue_capacity) return SendStatus::kFull;

  const Faults::Verdict verdict = faults_.on_message(provider, from_provider, message);
  if (!verdict.deliver) return SendStatus::kSent;  // lost in flight: the sender cannot know
  for (int copy = 0; copy < verdict.copies; ++copy) {
    Mailbox::Item item{Clock::now() + verdict.delay,
                       Received{from, verdict.rewrite ? verdict.rewrite(message) : message, {}}};
    const auto at = std::upper_bound(
        mailbox->items.begin(), mailbox->items.end(), item.deliver_at,
        [](Clock::time_point t, const Mailbox::Item& other) { return t < other.deliver_at; });
    mailbox->items.insert(at, std::move(item));
  }
  mailbox->changed.notify_all();
  return SendStatus::kSent;
}

std::optional<Received> Network::take(const PeerId& name, Mailbox& mailbox,
                                      std::chrono::milliseconds timeout, bool pop) {
  const auto deadline = Clock::now() + timeout;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    const auto now = Clock::now();
    if (name != kHeadPeer && faults_.is_cut(name)) {
      mailbox.items.clear();  // a dead or partitioned provider never sees these
    } else if (!mailbox.items.empty() && mailbox.items.front().deliver_at <= now) {
      if (!pop) return mailbox.items.front().received;
      Received received = std::move(mailbox.items.front().received);
      mailbox.items.pop_front();
      mailbox.changed.notify_all();  // room for a blocked sender
      return received;
    }
    if (now >= deadline) return std::nullopt;
    auto wake = deadline;
    if (!mailbox.items.empty()) wake = std::min(wake, mailbox.items.front().deliver_at);
    mailbox.changed.wait_until(lock, wake);
  }
}

}  // namespace xloco::net::inproc
