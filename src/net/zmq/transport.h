// The ZeroMQ backend of Transport: a ROUTER on the head (Server) and a DEALER on each
// provider leader (Client), both CURVE-encrypted unless options say insecure. The head names
// each provider by the allow-list entry that admitted its key (ZAP User-Id), so a provider
// cannot claim another's name; a reconnecting provider keeps its name under a new connection.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include <zmq.hpp>

#include "common/log_limit.h"
#include "net/transport.h"
#include "net/zmq/auth.h"
#include "net/zmq/options.h"
#include "net/zmq/wire.h"

namespace xloco::net::zeromq {

// The send queues and the receive streams of one socket, shared by Server and Client.
class Links {
 public:
  explicit Links(TransportLimits limits) : limits_(limits) {}
  // Queues `message` for `peer` and moves what the socket takes; kNoPeer when the socket
  // reports the peer gone.
  SendStatus send(::zmq::socket_t& socket, const PeerId& peer, const std::string* routing_id,
                  const Message& message, const SendOptions& options);
  // Moves `peer`'s queue on as far as the socket takes it; false when the peer is gone.
  bool pump(::zmq::socket_t& socket, const PeerId& peer, const std::string* routing_id);
  // One received ZeroMQ message from `peer` (its header at parts[first]): a whole Message,
  // or nullopt (a chunk taken, or dropped and logged).
  std::optional<Message> take(const PeerId& peer, std::vector<::zmq::message_t>& parts,
                              std::size_t first, spdlog::logger& logger);

  // Forgets a peer: what is queued for it and any stream half received from it.
  void drop(const PeerId& peer) {
    outbox_.drop(peer);
    incoming_.erase(peer);
  }
  // The peer reconnected: a message in transfer to it starts over, and one half received
  // from its old connection is gone.
  void reconnected(const PeerId& peer) {
    outbox_.restart(peer);
    incoming_.erase(peer);
  }
  Outbox& outbox() { return outbox_; }
  const Outbox& outbox() const { return outbox_; }
  void set_limits(const TransportLimits& limits) { limits_ = limits; }

 private:
  TransportLimits limits_;
  common::LogLimiter log_limit_;  // dropped-message warnings, by peer
  Outbox outbox_;
  std::uint64_t next_stream_ = 1;
  std::unordered_map<PeerId, Reassembly> incoming_;
};

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
  LinkState link_state(const PeerId& peer) const override { return links_.outbox().state(peer); }
  void drop_queue(const PeerId& peer) override { links_.drop(peer); }
  void set_limits(const TransportLimits& limits) override { links_.set_limits(limits); }

  // Connections whose CURVE key the allow-list refused, since start.
  std::uint64_t refused() const noexcept { return gatekeeper_->refused(); }

 private:
  void pump_all();
  std::optional<Received> read_one();

  ServerOptions options_;
  std::shared_ptr<spdlog::logger> logger_;
  ::zmq::context_t context_;
  ::zmq::socket_t socket_;
  std::unique_ptr<Gatekeeper> gatekeeper_;
  std::string endpoint_;
  // Authenticated peer name → routing id of its latest connection.
  std::unordered_map<PeerId, std::string> routes_;
  Links links_;
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
  LinkState link_state(const PeerId& peer) const override { return links_.outbox().state(peer); }
  void drop_queue(const PeerId& peer) override { links_.outbox().drop(peer); }
  void set_limits(const TransportLimits& limits) override { links_.set_limits(limits); }

 private:
  ClientOptions options_;
  std::shared_ptr<spdlog::logger> logger_;
  ::zmq::context_t context_;
  ::zmq::socket_t socket_;
  Links links_;
};

}  // namespace xloco::net::zeromq
