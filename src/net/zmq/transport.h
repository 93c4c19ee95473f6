// The ZeroMQ backend of Transport: a ROUTER on the head (Server) and a DEALER on each
// provider leader (Client), both CURVE-encrypted unless options say insecure. The head names
// each provider by the allow-list entry that admitted its key (ZAP User-Id), so a provider
// cannot claim another's name; a reconnecting provider keeps its name under a new connection.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include <zmq.hpp>

#include "net/transport.h"
#include "net/zmq/auth.h"
#include "net/zmq/options.h"

namespace xloco::net::zeromq {

class Server final : public Transport {
 public:
  // Binds at once; throws TransportError (bad address, port in use) or KeyError.
  explicit Server(ServerOptions options);
  ~Server() override;

  [[nodiscard]] SendStatus send(const PeerId& peer, const Message& message,
                                const SendOptions& options = {}) override;
  [[nodiscard]] std::optional<Received> receive(std::chrono::milliseconds timeout) override;
  [[nodiscard]] bool poll(std::chrono::milliseconds timeout) override;
  std::string endpoint() const override { return endpoint_; }

  // Connections whose CURVE key the allow-list refused, since start.
  std::uint64_t refused() const noexcept { return gatekeeper_->refused(); }

 private:
  ServerOptions options_;
  std::shared_ptr<spdlog::logger> logger_;
  ::zmq::context_t context_;
  ::zmq::socket_t socket_;
  std::unique_ptr<Gatekeeper> gatekeeper_;
  std::string endpoint_;
  // Authenticated peer name → routing id of its latest connection.
  std::unordered_map<PeerId, std::string> routes_;
  int send_timeout_ms_ = -2;  // ZMQ_SNDTIMEO last set, to skip redundant setsockopt calls
};

class Client final : public Transport {
 public:
  // Connects in the background (ZeroMQ queues sends until the head is reached, and
  // reconnects by itself); throws TransportError or KeyError on bad options only.
  explicit Client(ClientOptions options);
  ~Client() override;

  // `peer` must be kHeadPeer.
  [[nodiscard]] SendStatus send(const PeerId& peer, const Message& message,
                                const SendOptions& options = {}) override;
  [[nodiscard]] std::optional<Received> receive(std::chrono::milliseconds timeout) override;
  [[nodiscard]] bool poll(std::chrono::milliseconds timeout) override;
  std::string endpoint() const override { return options_.connect; }

 private:
  ClientOptions options_;
  std::shared_ptr<spdlog::logger> logger_;
  ::zmq::context_t context_;
  ::zmq::socket_t socket_;
  int send_timeout_ms_ = -2;
};

}  // namespace xloco::net::zeromq
