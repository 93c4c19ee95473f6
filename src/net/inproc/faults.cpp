#include "net/inproc/faults.h"

#include "net/protocol.h"

namespace xloco::net::inproc {

void Faults::drop_next(const PeerId& peer, std::size_t count, Direction direction) {
  std::lock_guard<std::mutex> lock(mutex_);
  Link& link = links_[peer];
  if (direction != Direction::kToPeer) link.drop_from += count;
  if (direction != Direction::kFromPeer) link.drop_to += count;
}

void Faults::duplicate_next(const PeerId& peer, std::size_t count, Direction direction,
                            std::optional<MessageType> type) {
  std::lock_guard<std::mutex> lock(mutex_);
  Link& link = links_[peer];
  link.duplicate_type = type;
  if (direction != Direction::kToPeer) link.duplicate_from += count;
  if (direction != Direction::kFromPeer) link.duplicate_to += count;
}

void Faults::delay(const PeerId& peer, std::chrono::milliseconds delay, Direction direction) {
  std::lock_guard<std::mutex> lock(mutex_);
  Link& link = links_[peer];
  if (direction != Direction::kToPeer) link.delay_from = delay;
  if (direction != Direction::kFromPeer) link.delay_to = delay;
}

void Faults::fail_at_message(const PeerId& peer, std::size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  links_[peer].fail_at_message = index;
}

void Faults::fail_at(const PeerId& peer, std::uint64_t round) {
  std::lock_guard<std::mutex> lock(mutex_);
  links_[peer].fail_at_round = round;
}

void Faults::cut(const PeerId& peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  links_[peer].cut = true;
}

void Faults::heal(const PeerId& peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::size_t sent = links_[peer].sent;
  links_[peer] = Link{};
  links_[peer].sent = sent;
}

void Faults::tamper(const PeerId& peer, Rewrite rewrite) {
  std::lock_guard<std::mutex> lock(mutex_);
  links_[peer].rewrite = std::move(rewrite);
}

bool Faults::is_cut(const PeerId& peer) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = links_.find(peer);
  return it != links_.end() && it->second.cut;
}

std::size_t Faults::lost() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lost_;
}

Faults::Verdict Faults::on_message(const PeerId& peer, bool from_peer, const Message& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = links_.find(peer);
  if (it == links_.end()) return {};
  Link& link = it->second;
  const std::size_t index = from_peer ? link.sent++ : 0;
  if (!link.cut && from_peer && link.fail_at_message && index >= *link.fail_at_message) {
    link.cut = true;
  }
  if (!link.cut && link.fail_at_round) {
    const auto round = peek_round(message);
    if (round && *round >= *link.fail_at_round) link.cut = true;
  }
  std::size_t& drops = from_peer ? link.drop_from : link.drop_to;
  if (link.cut || drops > 0) {
    if (!link.cut) --drops;
    ++lost_;
    return {false, {}, 1, {}};
  }
  std::size_t& duplicates = from_peer ? link.duplicate_from : link.duplicate_to;
  const bool twice = duplicates > 0 && (!link.duplicate_type || peek_type(message) == link.duplicate_type);
  if (twice) --duplicates;
  const int copies = twice ? 2 : 1;
  return {true, from_peer ? link.delay_from : link.delay_to, copies,
          from_peer ? link.rewrite : Rewrite{}};
}

}  // namespace xloco::net::inproc
