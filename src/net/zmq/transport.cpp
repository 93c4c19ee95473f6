#include "net/zmq/transport.h"

#include <algorithm>
#include <iterator>
#include <vector>

#include <fmt/format.h>
#include <zmq_addon.hpp>
#include <spdlog/spdlog.h>

#include "net/errors.h"
#include "net/zmq/wire.h"

namespace xloco::net::zeromq {
namespace {

using Clock = std::chrono::steady_clock;

// While a send queue waits on a peer's link, receive() and poll() look again this often.
constexpr milliseconds kPumpInterval{5};

void apply_link_options(::zmq::socket_t& socket, const LinkOptions& link) {
  const auto ms = [](milliseconds d) { return static_cast<int>(d.count()); };
  socket.set(::zmq::sockopt::sndhwm, link.send_hwm);
  socket.set(::zmq::sockopt::rcvhwm, link.receive_hwm);
  socket.set(::zmq::sockopt::linger, ms(link.linger));
  socket.set(::zmq::sockopt::handshake_ivl, ms(link.handshake_timeout));
  socket.set(::zmq::sockopt::tcp_keepalive, 1);
  socket.set(::zmq::sockopt::tcp_keepalive_idle, link.keepalive_idle_s);
  socket.set(::zmq::sockopt::tcp_keepalive_intvl, link.keepalive_interval_s);
  socket.set(::zmq::sockopt::tcp_keepalive_cnt, link.keepalive_count);
}

// Every part is at most a chunk: a bigger one is not from xloco, and libzmq drops the
// connection before buffering it.
std::int64_t wire_limit(bool insecure) {
  return static_cast<std::int64_t>(kChunkBytes) + (insecure ? 0 : kCurveFrameOverhead);
}

bool wait_readable(::zmq::socket_t& socket, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    ::zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    const auto left =
        std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
    try {
      return ::zmq::poll(&item, 1, left) > 0;
    } catch (const ::zmq::error_t& e) {
      if (e.num() != EINTR) throw TransportError(fmt::format("poll failed: {}", e.what()));
    }
  }
}

std::vector<::zmq::message_t> receive_parts(::zmq::socket_t& socket) {
  std::vector<::zmq::message_t> parts;
  try {
    (void)::zmq::recv_multipart(socket, std::back_inserter(parts), ::zmq::recv_flags::dontwait);
  } catch (const ::zmq::error_t& e) {
    throw TransportError(fmt::format("receive failed: {}", e.what()));
  }
  return parts;
}

// An insecure peer that set no name gets libzmq's binary routing id; make it printable.
PeerId printable_id(const std::string& routing_id) {
  if (!routing_id.empty() && routing_id[0] != '\0') return routing_id;
  std::string hex = "peer-";
  for (unsigned char c : routing_id) hex += fmt::format("{:02x}", c);
  return hex;
}

std::shared_ptr<spdlog::logger> logger_or_default(const std::shared_ptr<spdlog::logger>& l) {
  return l ? l : spdlog::default_logger();
}

void check_keypair(const KeyPair& key, const char* whose) {
  XLOCO_ENFORCE(is_z85_key(key.public_key) && is_z85_key(key.secret_key), KeyError,
                "{} has no valid CURVE key pair (make one with `xloco keygen NAME`), "
                "or set insecure for a plaintext link",
                whose);
}

// Waits on the socket until `deadline`, moving send queues on every kPumpInterval while any
// waits; true when a message is readable.
template <typename Pump, typename Pending>
bool wait_pumping(::zmq::socket_t& socket, Clock::time_point deadline, Pump pump,
                  Pending pending) {
  for (;;) {
    pump();
    const auto left = std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(
                                                    deadline - Clock::now()));
    if (wait_readable(socket, pending() ? std::min(left, kPumpInterval) : left)) return true;
    if (Clock::now() >= deadline) return false;
  }
}

}  // namespace

SendStatus Links::send(::zmq::socket_t& socket, const PeerId& peer, const std::string* routing_id,
                       const Message& message, const SendOptions& options) {
  XLOCO_ENFORCE(!message.empty(), NetError, "cannot send a message without frames");
  // Only a message that goes whole may pass a stream: two interleaved streams are garbage.
  const bool urgent = options.urgent && fits_one_chunk(message);
  const SendStatus status = outbox_.push(peer, message, urgent, limits_.queue_bytes);
  if (status != SendStatus::kSent) return status;
  return pump(socket, peer, routing_id) ? SendStatus::kSent : SendStatus::kNoPeer;
}

bool Links::pump(::zmq::socket_t& socket, const PeerId& peer, const std::string* routing_id) {
  for (;;) {
    bool urgent = false;
    Outbox::Item* item = outbox_.front(peer, urgent);
    if (item == nullptr) return true;
    if (item->stream == 0) item->stream = next_stream_++;
    const UnitResult r = send_unit(socket, routing_id, *item, item->stream);
    if (r.status == UnitStatus::kBlocked) return true;
    if (r.status == UnitStatus::kNoPeer) {
      outbox_.drop(peer);
      return false;
    }
    outbox_.advance(peer, urgent, r.bytes, r.done);
  }
}

std::optional<Message> Links::take(const PeerId& peer, std::vector<::zmq::message_t>& parts,
                                   std::size_t first, spdlog::logger& logger) {
  std::string error;
  auto message = incoming_[peer].take(parts, first, limits_.max_frame_bytes, error,
                                      limits_.max_frames);
  if (error.empty()) return message;
  if (const auto v = log_limit_.check(peer); v.log) {
    logger.warn("net: dropped a message from {}: {}{}", peer, error, common::LogLimiter::note(v));
  }
  return message;
}

Server::Server(ServerOptions options)
    : options_(std::move(options)),
      logger_(logger_or_default(options_.link.logger)),
      context_(options_.link.io_threads),
      socket_(context_, ::zmq::socket_type::router),
      links_(options_.limits) {
  const bool insecure = options_.link.insecure;
  try {
    apply_link_options(socket_, options_.link);
    // A send to a provider that is gone fails at once (EHOSTUNREACH → kNoPeer) instead of
    // vanishing, and one to a provider whose queue is full says so (EAGAIN) instead of
    // dropping the message: it waits in the outbox.
    socket_.set(::zmq::sockopt::router_mandatory, 1);
    socket_.set(::zmq::sockopt::maxmsgsize, wire_limit(insecure));
    if (insecure) {
      // Names are claimed, not proven; a reconnecting provider takes its name over.
      socket_.set(::zmq::sockopt::router_handover, 1);
      gatekeeper_ = std::make_unique<Gatekeeper>(context_, socket_, std::nullopt, logger_, 0);
    } else {
      check_keypair(options_.key, "the head");
      XLOCO_ENFORCE(!options_.allow.empty(), KeyError,
                    "the head's allow-list is empty, so no provider could join; list the "
                    "providers' .pub files");
      socket_.set(::zmq::sockopt::curve_server, 1);
      socket_.set(::zmq::sockopt::curve_secretkey, options_.key.secret_key);
      socket_.set(::zmq::sockopt::zap_domain, "xloco");
      gatekeeper_ = std::make_unique<Gatekeeper>(context_, socket_, options_.allow, logger_,
                                                 options_.max_handshakes_per_minute);
    }
    socket_.bind(options_.bind);
    endpoint_ = socket_.get(::zmq::sockopt::last_endpoint);
  } catch (const ::zmq::error_t& e) {
    throw TransportError(fmt::format("cannot start the head on {}: {}", options_.bind, e.what()));
  }
  if (insecure) {
    logger_->warn("net: INSECURE head on {}: plaintext, and anyone who can reach this port can "
                  "join. Use only on a trusted loopback or private network.",
                  endpoint_);
  } else {
    logger_->info("net: head listening on {} (CURVE, {} allow-listed provider keys)", endpoint_,
                  options_.allow.size());
  }
}

Server::~Server() {
  // The socket goes first, so there is never a listening CURVE socket without a ZAP handler.
  socket_.close();
  gatekeeper_.reset();
}

SendStatus Server::send(const PeerId& peer, const Message& message, const SendOptions& options) {
  const auto route = routes_.find(peer);
  if (route == routes_.end()) return SendStatus::kNoPeer;
  const SendStatus status = links_.send(socket_, peer, &route->second, message, options);
  if (status == SendStatus::kNoPeer) routes_.erase(route);
  return status;
}

void Server::pump_all() {
  for (const PeerId& peer : links_.outbox().waiting()) {
    const auto route = routes_.find(peer);
    if (route == routes_.end()) {
      links_.drop(peer);
    } else if (!links_.pump(socket_, peer, &route->second)) {
      routes_.erase(route);
    }
  }
}

bool Server::poll(std::chrono::milliseconds timeout) {
  return wait_pumping(socket_, Clock::now() + timeout, [this] { pump_all(); },
                      [this] { return !links_.outbox().waiting().empty(); });
}

std::optional<Received> Server::receive(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (poll(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()))) {
    if (auto received = read_one()) return received;
  }
  return std::nullopt;
}

std::optional<Received> Server::read_one() {
  std::vector<::zmq::message_t> parts = receive_parts(socket_);
  if (parts.size() < 2) return std::nullopt;  // a ROUTER always prefixes the routing id
  std::string routing_id = parts[0].to_string();
  PeerId peer;
  if (options_.link.insecure) {
    peer = printable_id(routing_id);
  } else {
    // Set from our ZAP answer: the allow-list name of the key that finished the handshake.
    const char* user_id = zmq_msg_gets(parts[1].handle(), "User-Id");
    if (user_id == nullptr || *user_id == '\0') {
      logger_->error("net: dropped a message from an unauthenticated connection");
      return std::nullopt;
    }
    peer = user_id;
  }
  auto& route = routes_[peer];
  if (!route.empty() && route != routing_id) links_.reconnected(peer);
  route = std::move(routing_id);
  const char* address = zmq_msg_gets(parts[1].handle(), "Peer-Address");
  std::optional<Message> message = links_.take(peer, parts, 1, *logger_);
  if (!message) return std::nullopt;
  return Received{std::move(peer), std::move(*message), address ? address : ""};
}

Client::Client(ClientOptions options)
    : options_(std::move(options)),
      logger_(logger_or_default(options_.link.logger)),
      context_(options_.link.io_threads),
      socket_(context_, ::zmq::socket_type::dealer),
      links_(options_.limits) {
  const bool insecure = options_.link.insecure;
  try {
    apply_link_options(socket_, options_.link);
    socket_.set(::zmq::sockopt::reconnect_ivl, static_cast<int>(options_.reconnect_interval.count()));
    socket_.set(::zmq::sockopt::reconnect_ivl_max,
                static_cast<int>(options_.reconnect_interval_max.count()));
    socket_.set(::zmq::sockopt::maxmsgsize, wire_limit(insecure));
    if (insecure) {
      if (!options_.name.empty()) {
        XLOCO_ENFORCE(options_.name.size() <= 255 && options_.name[0] != '\0', NetError,
                      "a provider name is 1 to 255 bytes and does not start with a NUL");
        socket_.set(::zmq::sockopt::routing_id, options_.name);
      }
    } else {
      check_keypair(options_.key, "this provider");
      XLOCO_ENFORCE(is_z85_key(options_.server_public_key), KeyError,
                    "the head's public key is missing or not a Z85 key (it is printed by "
                    "`xloco head` and stored in its .pub file)");
      socket_.set(::zmq::sockopt::curve_serverkey, options_.server_public_key);
      socket_.set(::zmq::sockopt::curve_publickey, options_.key.public_key);
      socket_.set(::zmq::sockopt::curve_secretkey, options_.key.secret_key);
    }
    socket_.connect(options_.connect);
  } catch (const ::zmq::error_t& e) {
    throw TransportError(
        fmt::format("cannot connect a provider to {}: {}", options_.connect, e.what()));
  }
  if (insecure) {
    logger_->warn("net: INSECURE link to {}: plaintext and unauthenticated. Use only on a "
                  "trusted loopback or private network.",
                  options_.connect);
  } else {
    logger_->info("net: provider connecting to {} (CURVE)", options_.connect);
  }
}

Client::~Client() = default;

SendStatus Client::send(const PeerId& peer, const Message& message, const SendOptions& options) {
  XLOCO_ENFORCE(peer == kHeadPeer, NetError, "a provider can only send to \"{}\", not \"{}\"",
                kHeadPeer, peer);
  // A DEALER has no unreachable peer: what it cannot send yet waits in its queue.
  return links_.send(socket_, kHeadPeer, nullptr, message, options);
}

bool Client::poll(std::chrono::milliseconds timeout) {
  return wait_pumping(socket_, Clock::now() + timeout,
                      [this] { (void)links_.pump(socket_, kHeadPeer, nullptr); },
                      [this] { return !links_.outbox().waiting().empty(); });
}

std::optional<Received> Client::receive(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (poll(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()))) {
    std::vector<::zmq::message_t> parts = receive_parts(socket_);
    if (auto message = links_.take(kHeadPeer, parts, 0, *logger_)) {
      return Received{kHeadPeer, std::move(*message), {}};
    }
  }
  return std::nullopt;
}

}  // namespace xloco::net::zeromq
