#include "net/zmq/auth.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <zmq_addon.hpp>
#include <spdlog/spdlog.h>

#include "net/errors.h"

namespace xloco::net::zeromq {
namespace {

constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";  // fixed by RFC 27
constexpr int kMonitoredEvents = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                 ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                 ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                                 ZMQ_EVENT_DISCONNECTED;

std::string unique_inproc(const char* what) {
  static std::atomic<std::uint64_t> next{0};
  return fmt::format("inproc://xloco-{}-{}", what, next.fetch_add(1));
}

std::string protocol_error_text(std::uint32_t code) {
  switch (code) {
    case ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
      return "security mechanism mismatch (a plaintext peer on a CURVE link, or the reverse)";
    case ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
      return "cryptographic failure (the client has a wrong server public key?)";
    case ZMQ_PROTOCOL_ERROR_ZMTP_KEY_EXCHANGE:
      return "CURVE key exchange failed";
    default:
      return fmt::format("ZMTP protocol error 0x{:08x}", code);
  }
}

std::string z85_of(const ::zmq::message_t& key) {
  char text[41] = {};
  if (key.size() != 32 || zmq_z85_encode(text, key.data<std::uint8_t>(), 32) == nullptr) {
    return fmt::format("<{}-byte credential>", key.size());
  }
  return text;
}

}  // namespace

Gatekeeper::Gatekeeper(::zmq::context_t& context, ::zmq::socket_t& watched,
                       std::optional<AllowList> allow, std::shared_ptr<spdlog::logger> logger,
                       int handshakes_per_minute)
    : allow_(std::move(allow)),
      handshakes_per_minute_(handshakes_per_minute),
      logger_(logger ? std::move(logger) : spdlog::default_logger()),
      zap_(context, ::zmq::socket_type::rep),
      monitor_(context, ::zmq::socket_type::pair),
      stop_sender_(context, ::zmq::socket_type::pair),
      stop_receiver_(context, ::zmq::socket_type::pair) {
  for (::zmq::socket_t* socket : {&zap_, &monitor_, &stop_sender_, &stop_receiver_}) {
    socket->set(::zmq::sockopt::linger, 0);  // inproc only: nothing worth waiting for
  }
  try {
    // Bound before the watched socket is: a CURVE handshake that finds no handler is admitted.
    if (allow_) zap_.bind(kZapEndpoint);
    const std::string monitor_endpoint = unique_inproc("monitor");
    XLOCO_ENFORCE(zmq_socket_monitor(watched.handle(), monitor_endpoint.c_str(),
                                     kMonitoredEvents) == 0,
                  TransportError, "cannot monitor the head socket: {}",
                  zmq_strerror(zmq_errno()));
    monitor_.connect(monitor_endpoint);
    const std::string stop_endpoint = unique_inproc("stop");
    stop_receiver_.bind(stop_endpoint);
    stop_sender_.connect(stop_endpoint);
  } catch (const ::zmq::error_t& e) {
    throw TransportError(fmt::format("cannot start the ZAP handler: {}", e.what()));
  }
  thread_ = std::thread([this] { run(); });
}

Gatekeeper::~Gatekeeper() {
  try {
    stop_sender_.send(::zmq::str_buffer("stop"), ::zmq::send_flags::none);
  } catch (const ::zmq::error_t&) {
    // The context is terminating, which stops the thread too.
  }
  thread_.join();
}

void Gatekeeper::run() noexcept {
  std::vector<::zmq::pollitem_t> items = {{stop_receiver_.handle(), 0, ZMQ_POLLIN, 0},
                                          {monitor_.handle(), 0, ZMQ_POLLIN, 0}};
  if (allow_) items.push_back({zap_.handle(), 0, ZMQ_POLLIN, 0});
  for (;;) {
    try {
      ::zmq::poll(items.data(), items.size(), std::chrono::milliseconds(-1));
      if (items[0].revents & ZMQ_POLLIN) return;
      if (items[1].revents & ZMQ_POLLIN) log_monitor_event();
      if (items.size() > 2 && (items[2].revents & ZMQ_POLLIN)) answer_zap();
    } catch (const ::zmq::error_t& e) {
      if (e.num() == ETERM) return;
      // Keep serving: while this thread lives, an unanswered ZAP request stalls a handshake,
      // which is safe; a dead handler would not be.
      logger_->error("net: ZAP handler: {}", e.what());
    } catch (const std::exception& e) {
      logger_->error("net: ZAP handler: {}", e.what());
    }
  }
}

void Gatekeeper::answer_zap() {
  std::vector<::zmq::message_t> request;
  (void)::zmq::recv_multipart(zap_, std::back_inserter(request));
  // RFC 27: version, request id, domain, address, identity, mechanism, credentials…
  std::string status = "400";
  std::string status_text = "not on the allow-list";
  std::string user_id;
  const std::string address = request.size() > 3 ? request[3].to_string() : "?";
  if (request.size() < 6 || request[0].to_string_view() != "1.0") {
    status = "500";
    status_text = "malformed ZAP request";
    logger_->error("net: malformed ZAP request ({} frames)", request.size());
  } else if (request[5].to_string_view() != "CURVE" || request.size() < 7) {
    status_text = "CURVE required";
    refused_.fetch_add(1);
    if (const auto v = log_limit_.check("plain " + address); v.log) {
      logger_->warn("net: refused a {} client from {}: CURVE is required{}",
                    request[5].to_string(), address, common::LogLimiter::note(v));
    }
  } else {
    const std::string key = z85_of(request[6]);
    if (const std::string* name = allow_->find(key); name && !take_handshake(*name)) {
      status_text = "too many connections";
      refused_.fetch_add(1);
      if (const auto v = log_limit_.check("rate " + *name); v.log) {
        logger_->warn("net: refused provider {} from {}: more than {} handshakes a minute{}",
                      *name, address, handshakes_per_minute_, common::LogLimiter::note(v));
      }
    } else if (name) {
      status = "200";
      status_text = "OK";
      user_id = *name;
      logger_->info("net: admitted provider {} (key {}) from {}", *name, key, address);
    } else {
      refused_.fetch_add(1);
      if (const auto v = log_limit_.check("key " + address); v.log) {
        logger_->warn("net: refused CURVE client from {}: public key {} is not on the "
                      "allow-list{}",
                      address, key, common::LogLimiter::note(v));
      }
    }
  }
  std::vector<::zmq::message_t> reply;
  reply.emplace_back(std::string_view("1.0"));
  reply.emplace_back(request.size() > 1 ? request[1].to_string_view() : std::string_view());
  reply.emplace_back(std::string_view(status));
  reply.emplace_back(std::string_view(status_text));
  reply.emplace_back(std::string_view(user_id));
  reply.emplace_back();  // no metadata
  (void)::zmq::send_multipart(zap_, reply);
}

bool Gatekeeper::take_handshake(const std::string& name) {
  if (handshakes_per_minute_ <= 0) return true;
  const auto now = std::chrono::steady_clock::now();
  const double burst = handshakes_per_minute_;
  auto [it, fresh] = buckets_.try_emplace(name, Bucket{burst, now});
  Bucket& b = it->second;
  b.tokens = std::min(burst, b.tokens + std::chrono::duration<double>(now - b.at).count() *
                                            handshakes_per_minute_ / 60.0);
  b.at = now;
  if (b.tokens < 1) return false;
  b.tokens -= 1;
  return true;
}

void Gatekeeper::log_monitor_event() {
  std::vector<::zmq::message_t> event;
  (void)::zmq::recv_multipart(monitor_, std::back_inserter(event));
  if (event.size() != 2 || event[0].size() < 6) return;
  std::uint16_t id = 0;
  std::uint32_t value = 0;
  std::memcpy(&id, event[0].data(), sizeof id);
  std::memcpy(&value, event[0].data<std::uint8_t>() + sizeof id, sizeof value);
  const std::string endpoint = event[1].to_string();
  switch (id) {
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      if (const auto v = log_limit_.check("handshake " + endpoint); v.log) {
        logger_->warn("net: handshake failed on {}: {}{}", endpoint, protocol_error_text(value),
                      common::LogLimiter::note(v));
      }
      break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
      if (const auto v = log_limit_.check("handshake " + endpoint); v.log) {
        logger_->warn("net: handshake failed on {}: {}{}{}", endpoint, std::strerror(int(value)),
                      value == EPIPE || value == ECONNRESET
                          ? " (the client hung up mid-handshake: plaintext, wrong server key, or "
                            "not xloco)"
                          : "",
                      common::LogLimiter::note(v));
      }
      break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:  // the ZAP answer above already named the key
      logger_->debug("net: handshake on {} refused with ZAP status {}", endpoint, value);
      break;
    case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
      logger_->debug("net: handshake succeeded on {}", endpoint);
      break;
    case ZMQ_EVENT_DISCONNECTED:
      logger_->debug("net: a peer disconnected from {}", endpoint);
      break;
    default:
      break;
  }
}

}  // namespace xloco::net::zeromq
