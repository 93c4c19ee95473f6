// A provider leader's link to the head, on its own thread: it sends what the leader posts,
// sends a HEARTBEAT every outer.heartbeat_s (so a provider deep in its inner steps is not taken
// for dead; urgent, so they pass a long transfer), and queues what arrives, decoded. The
// heartbeats start once the first post (the HELLO) has gone: one that reached the head before
// it would be from a stranger, and is refused (a head slow to start reads them all at once).
// The transport is used from this thread only.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/config.h"
#include "net/protocol.h"
#include "net/transport.h"
#include "outer/round/round.h"

namespace xloco::outer {

class Link {
 public:
  Link(std::unique_ptr<net::Transport> transport, const common::Config& config);
  ~Link();  // sends what was posted (a BYE), then stops the thread
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  void post(net::Body body, uint64_t round);
  // The next message from the head, waiting up to `timeout`.
  std::optional<net::Envelope> next(std::chrono::milliseconds timeout);
  // What the heartbeats report.
  void set_progress(uint64_t round, uint64_t step, double tokens_per_s);
  double head_silent_s() const;  // since anything last came from the head
  Clock::time_point last_rx() const;
  std::string endpoint() const { return net_->endpoint(); }
  // Why this link cannot work, once it is known: the head answered 3 messages in a row for
  // another run (run.name differs). Empty while there is hope.
  std::optional<std::string> fatal() const;

 private:
  void loop();
  void send(const net::Message& m, bool urgent = false);

  std::unique_ptr<net::Transport> net_;
  const std::string run_;
  const double heartbeat_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<net::Message> outbox_;
  std::deque<net::Envelope> inbox_;
  bool stop_ = false;
  bool posted_ = false;  // the first post (the HELLO) has been queued: heartbeats may follow it
  uint64_t round_ = 0, step_ = 0;
  double tokens_per_s_ = 0;
  Clock::time_point last_rx_ = Clock::now();
  int wrong_run_ = 0;                  // messages in a row for another run
  std::optional<std::string> fatal_;
  std::thread thread_;  // last: starts once everything above exists
};

}  // namespace xloco::outer
