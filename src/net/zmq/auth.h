// Gatekeeper: the head's guard thread. It answers ZAP requests (RFC 27), admitting only
// CURVE clients whose public key is on the allow-list and naming them by their list entry,
// and it logs every failed handshake seen by the socket monitor (a plaintext client, a wrong
// server key, a refused key). Without a ZAP handler CURVE admits any client (libzmq #2594),
// so the head builds this before it binds.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <zmq.hpp>

#include "common/log_limit.h"
#include "net/keys.h"

namespace spdlog {
class logger;
}

namespace xloco::net::zeromq {

class Gatekeeper {
 public:
  // Binds the context's ZAP endpoint (only when `allow` is set) and monitors `watched`, which
  // must not be bound yet. `context` and `watched` must outlive the Gatekeeper. Each listed
  // key may complete `handshakes_per_minute` handshakes in a burst, then one every
  // 60 / handshakes_per_minute seconds (0: no limit).
  Gatekeeper(::zmq::context_t& context, ::zmq::socket_t& watched, std::optional<AllowList> allow,
             std::shared_ptr<spdlog::logger> logger, int handshakes_per_minute);
  ~Gatekeeper();  // stops and joins the thread
  Gatekeeper(const Gatekeeper&) = delete;
  Gatekeeper& operator=(const Gatekeeper&) = delete;

  std::uint64_t refused() const noexcept { return refused_.load(); }

 private:
  void run() noexcept;
  void answer_zap();
  void log_monitor_event();

  // Whether `name` may complete another handshake now (a token bucket per key).
  bool take_handshake(const std::string& name);

  std::optional<AllowList> allow_;
  const int handshakes_per_minute_;
  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point at{};
  };
  std::map<std::string, Bucket> buckets_;  // by allow-list name; the gatekeeper thread only
  common::LogLimiter log_limit_;           // warnings a client can provoke, by address
  std::shared_ptr<spdlog::logger> logger_;
  ::zmq::socket_t zap_;
  ::zmq::socket_t monitor_;
  ::zmq::socket_t stop_sender_;
  ::zmq::socket_t stop_receiver_;
  std::atomic<std::uint64_t> refused_{0};
  std::thread thread_;
};

}  // namespace xloco::net::zeromq
