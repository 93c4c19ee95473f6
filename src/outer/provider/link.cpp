#include "outer/provider/link.h"

#include "common/text.h"

#include <spdlog/spdlog.h>

namespace xloco::outer {

Link::Link(std::unique_ptr<net::Transport> transport, const common::Config& config)
    : net_(std::move(transport)), run_(config.run.name), heartbeat_s_(config.outer.heartbeat_s),
      thread_([this] { loop(); }) {}

Link::~Link() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  thread_.join();
}

void Link::post(net::Body body, uint64_t round) {
  std::lock_guard<std::mutex> lock(mu_);
  outbox_.push_back(net::encode(net::Envelope{run_, round, std::move(body)}));
  posted_ = true;
}

std::optional<net::Envelope> Link::next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [this] { return !inbox_.empty(); })) return std::nullopt;
  auto m = std::move(inbox_.front());
  inbox_.pop_front();
  return m;
}

void Link::set_progress(uint64_t round, uint64_t step, double tokens_per_s) {
  std::lock_guard<std::mutex> lock(mu_);
  round_ = round;
  step_ = step;
  tokens_per_s_ = tokens_per_s;
}

Clock::time_point Link::last_rx() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_rx_;
}

double Link::head_silent_s() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::chrono::duration<double>(Clock::now() - last_rx_).count();
}

void Link::loop() {
  auto last_beat = Clock::now();
  while (true) {
    std::deque<net::Message> out;
    bool stop = false, posted = false;
    net::Heartbeat beat;
    uint64_t round = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      out.swap(outbox_);
      stop = stop_;
      posted = posted_;
      beat = {step_, tokens_per_s_};
      round = round_;
    }
    for (const auto& m : out) send(m);
    if (stop) {  // after the last posts (a BYE) left the queue, or linger ran out
      const auto end = Clock::now() + std::chrono::seconds(2);
      while (net_->link_state(net::kHeadPeer).queued_messages > 0 && Clock::now() < end) {
        (void)net_->poll(std::chrono::milliseconds(10));
      }
      return;
    }
    // Sent after the posts taken above, so never ahead of the HELLO.
    if (posted && std::chrono::duration<double>(Clock::now() - last_beat).count() >= heartbeat_s_) {
      last_beat = Clock::now();
      send(net::encode(net::Envelope{run_, round, beat}), /*urgent=*/true);
    }
    auto rx = net_->receive(std::chrono::milliseconds(20));
    if (!rx) continue;
    try {
      auto env = net::decode(rx->message, run_);
      std::lock_guard<std::mutex> lock(mu_);
      last_rx_ = Clock::now();
      wrong_run_ = 0;
      inbox_.push_back(std::move(env));
      cv_.notify_one();
    } catch (const std::exception& e) {  // any decode failure: the message is dropped, not the link
      spdlog::warn("ignored a bad message from the head: {}", common::printable(e.what(), 512));
      const auto* pe = dynamic_cast<const net::ProtocolError*>(&e);
      if (pe == nullptr || pe->kind() != net::ProtocolErrorKind::kWrongRun) continue;
      std::lock_guard<std::mutex> lock(mu_);  // another run's: 3 in a row end the join
      if (++wrong_run_ >= 3 && !fatal_) {
        fatal_ = fmt::format(
            "the head at {} belongs to another run ({}): start this provider with the head's "
            "run.name (--set run.name=..., as the head's join line has it)",
            net_->endpoint(), common::printable(e.what(), 256));
        cv_.notify_one();
      }
    }
  }
}

void Link::send(const net::Message& m, bool urgent) {
  const auto st = net_->send(net::kHeadPeer, m, {urgent});
  if (st != net::SendStatus::kSent) {
    spdlog::warn("message to the head at {}: {}", net_->endpoint(), net::to_string(st));
  }
}

std::optional<std::string> Link::fatal() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fatal_;
}

}  // namespace xloco::outer
