#include "net/inproc/transport.h"

#include <algorithm>

#include "net/errors.h"

namespace xloco::net::inproc {

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
    return network_->deliver(name_, peer, message, options.timeout);
  }
  std::optional<Received> receive(std::chrono::milliseconds timeout) override {
    return network_->take(name_, *mailbox_, timeout, /*pop=*/true);
  }
  bool poll(std::chrono::milliseconds timeout) override {
    return network_->take(name_, *mailbox_, timeout, /*pop=*/false).has_value();
  }
  std::string endpoint() const override { return "inproc://" + kHeadPeer; }

 private:
  std::shared_ptr<Network> network_;
  PeerId name_;
  std::shared_ptr<Network::Mailbox> mailbox_;
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

SendStatus Network::deliver(const PeerId& from, const PeerId& to, const Message& message,
                            std::chrono::milliseconds timeout) {
  const bool from_provider = from != kHeadPeer;
  const PeerId& provider = from_provider ? from : to;
  std::unique_lock<std::mutex> lock(mutex_);
  const auto it = mailboxes_.find(to);
  if (it == mailboxes_.end()) return SendStatus::kNoPeer;
  if (!from_provider && faults_.is_cut(to)) return SendStatus::kNoPeer;
  const std::shared_ptr<Mailbox> mailbox = it->second;
  const bool room = mailbox->changed.wait_for(lock, timeout, [&] {
    return mailbox->closed || mailbox->items.size() < options_.queue_capacity;
  });
  if (mailbox->closed) return SendStatus::kNoPeer;
  if (!room) return SendStatus::kTimeout;

  const Faults::Verdict verdict = faults_.on_message(provider, from_provider, message);
  if (!verdict.deliver) return SendStatus::kSent;  // lost in flight: the sender cannot know
  for (int copy = 0; copy < verdict.copies; ++copy) {
    Mailbox::Item item{Clock::now() + verdict.delay, Received{from, message, {}}};
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
