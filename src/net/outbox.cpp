#include "net/outbox.h"

namespace xloco::net {
namespace {

std::size_t bytes_of(const Message& message) {
  std::size_t n = 0;
  for (const Frame& f : message) n += f.size();
  return n;
}

}  // namespace

SendStatus Outbox::push(const PeerId& peer, Message message, bool urgent, std::int64_t budget) {
  Queue& q = queues_[peer];
  const bool was_empty = q.regular.empty() && q.urgent.empty();
  Item item{std::move(message), 0, 0, false};
  item.bytes = bytes_of(item.message);
  if (!urgent && budget >= 0 && !was_empty &&
      q.bytes + item.bytes > static_cast<std::uint64_t>(budget)) {
    return SendStatus::kFull;
  }
  totals_[peer].enqueued += item.bytes;
  if (urgent) {
    if (q.urgent.size() >= kMaxUrgent) {
      q.bytes -= q.urgent.front().bytes;
      totals_[peer].taken += q.urgent.front().bytes;  // dropped counts as gone
      q.urgent.pop_front();
    }
    q.bytes += item.bytes;
    q.urgent.push_back(std::move(item));
  } else {
    q.bytes += item.bytes;
    q.regular.push_back(std::move(item));
  }
  if (was_empty) q.last_progress = Clock::now();
  return SendStatus::kSent;
}

Outbox::Item* Outbox::front(const PeerId& peer, bool& urgent) {
  const auto it = queues_.find(peer);
  if (it == queues_.end()) return nullptr;
  Queue& q = it->second;
  urgent = !q.urgent.empty();
  if (urgent) return &q.urgent.front();
  return q.regular.empty() ? nullptr : &q.regular.front();
}

void Outbox::advance(const PeerId& peer, bool urgent, std::size_t bytes, bool done) {
  Queue& q = queues_.at(peer);
  std::deque<Item>& d = urgent ? q.urgent : q.regular;
  Item& item = d.front();
  item.started = true;
  item.taken += bytes;
  q.bytes -= bytes;
  totals_[peer].taken += bytes;
  q.last_progress = Clock::now();
  if (done) {
    q.bytes -= item.bytes - item.taken;  // what was not counted as taken (a 0-byte unit)
    totals_[peer].taken += item.bytes - item.taken;
    d.pop_front();
  }
  if (q.regular.empty() && q.urgent.empty()) queues_.erase(peer);
}

void Outbox::restart(const PeerId& peer) {
  const auto it = queues_.find(peer);
  if (it == queues_.end() || it->second.regular.empty()) return;
  Item& item = it->second.regular.front();
  if (!item.started) return;
  it->second.bytes += item.taken;
  totals_[peer].taken -= item.taken;
  item.taken = 0;
  item.started = false;
  item.stream = 0;
}

LinkState Outbox::state(const PeerId& peer) const {
  LinkState s;
  if (const auto t = totals_.find(peer); t != totals_.end()) {
    s.enqueued_bytes = t->second.enqueued;
    s.taken_bytes = t->second.taken;
  }
  const auto it = queues_.find(peer);
  if (it == queues_.end()) return s;
  const Queue& q = it->second;
  s.queued_bytes = q.bytes;
  s.queued_messages = q.regular.size() + q.urgent.size();
  s.last_progress = q.last_progress;
  return s;
}

void Outbox::drop(const PeerId& peer) {
  queues_.erase(peer);
  totals_.erase(peer);
}

std::vector<PeerId> Outbox::waiting() const {
  std::vector<PeerId> out;
  out.reserve(queues_.size());
  for (const auto& [peer, q] : queues_) out.push_back(peer);
  return out;
}

}  // namespace xloco::net
