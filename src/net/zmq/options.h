// Settings of the ZeroMQ backend. Every socket option xloco sets is here, with the reason for
// its value; zmq/transport.cpp applies them and sets nothing else.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "net/keys.h"

namespace spdlog {
class logger;
}

namespace xloco::net::zeromq {

using std::chrono::milliseconds;

// Options that the head and a provider share.
struct LinkOptions {
  // ZMQ_SNDHWM / ZMQ_RCVHWM, in messages per peer. Messages here are whole rounds (up to
  // hundreds of MiB), so a few are plenty; a small queue bounds memory, and with
  // ZMQ_ROUTER_MANDATORY a full queue to one slow provider fails that send only.
  int send_hwm = 4;
  int receive_hwm = 4;
  // ZMQ_LINGER: how long closing waits to flush queued messages (a BYE, a last update).
  // Bounded, so that a dead peer cannot hang shutdown.
  milliseconds linger{2000};
  // ZMQ_HANDSHAKE_IVL: a connection that has not finished the CURVE handshake by then is
  // dropped, so half-open scanners cannot hold resources on the head's public port.
  milliseconds handshake_timeout{10000};
  // ZMQ_HEARTBEAT_IVL / _TIMEOUT / _TTL: ZMTP pings find dead TCP connections that the OS
  // would keep for hours. A ping waits behind a message being sent, so the timeout must be
  // longer than the largest message takes on the slowest link (64 MiB at 10 Mbit/s: 54 s).
  milliseconds heartbeat_interval{5000};
  milliseconds heartbeat_timeout{120000};
  // ZMQ_IO_THREADS of this end's context: the I/O thread does the CURVE crypto, and one
  // keeps up with about 1 GB/s, far above a WAN link; more only for many fast local peers.
  int io_threads = 1;
  // Plaintext and unauthenticated. Only for loopback experiments; warned about at every start.
  bool insecure = false;
  // Where refusals and warnings go; null means spdlog's default logger.
  std::shared_ptr<spdlog::logger> logger;
};

struct ServerOptions {
  std::string bind = "tcp://0.0.0.0:7700";  // port 0 or * picks a free port (see endpoint())
  KeyPair key;                              // the head's own key pair
  AllowList allow;                          // the providers admitted (CURVE mode)
  // The largest frame a provider may send, checked on the layout part before any frame is
  // assembled; a bigger one is dropped and logged, the provider stays connected. (libzmq has
  // the whole message by then: per part, ZMQ_MAXMSGSIZE = kChunkBytes bounds it, per peer the
  // receive HWM, and only allow-listed peers get this far.)
  std::int64_t max_frame_bytes = std::int64_t{1} << 30;
  LinkOptions link;
};

struct ClientOptions {
  std::string connect;            // the head's endpoint, tcp://HOST:PORT
  std::string server_public_key;  // the head's public key (Z85); CURVE mode
  KeyPair key;                    // this provider's key pair; CURVE mode
  // ZMQ_ROUTING_ID in insecure mode only: the name the head knows this provider by. With
  // CURVE the head names a provider by its allow-listed key instead, which cannot be forged.
  std::string name;
  // As for the head; -1 for none, as the head (trusted, authenticated) sends whole model
  // states.
  std::int64_t max_frame_bytes = -1;
  // ZMQ_RECONNECT_IVL / _MAX: retry fast after a blip, back off to the max while the head is
  // down, so a restarted head is rejoined within seconds without a storm of SYNs.
  milliseconds reconnect_interval{100};
  milliseconds reconnect_interval_max{5000};
  LinkOptions link;
};

// Wire constants of this backend (both ends must agree; they are not options).
//
// A Frame travels as parts of at most kChunkBytes, after one layout part that lists the frame
// sizes. libzmq's CURVE copies and encrypts each part through fresh buffers of the part's
// size: for 1 MiB parts those stay in cache and reuse heap memory, while one 64 MiB part
// faults in new pages for every copy (4.6x less CPU per byte with glibc's default malloc;
// experiments/RESULTS.md, issue 4).
inline constexpr std::size_t kChunkBytes = std::size_t{1} << 20;
// CURVE wraps each part in a MESSAGE command 33 bytes longer than the plaintext
// (16-byte command header and nonce, flags byte, 16-byte MAC); ZMQ_MAXMSGSIZE sees that size.
inline constexpr std::int64_t kCurveFrameOverhead = 33;

}  // namespace xloco::net::zeromq
