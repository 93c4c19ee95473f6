// Settings of the ZeroMQ backend. Every socket option xloco sets is here, with the reason for
// its value; zmq/transport.cpp applies them and sets nothing else.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "net/keys.h"
#include "net/transport.h"

namespace spdlog {
class logger;
}

namespace xloco::net::zeromq {

using std::chrono::milliseconds;

// Options that the head and a provider share.
struct LinkOptions {
  // ZMQ_SNDHWM / ZMQ_RCVHWM, in ZeroMQ messages per peer. Every message is at most one chunk
  // (wire.h), so these bound what each socket queue holds per peer (4 MiB each way); the rest
  // of a long transfer waits in the transport's outbox by reference, without a copy. They also
  // bound how long a heartbeat waits behind a transfer: 4 MiB take 3.4 s at 10 Mbit/s.
  int send_hwm = 4;
  int receive_hwm = 4;
  // ZMQ_LINGER: how long closing waits to flush queued messages (a BYE, a last update).
  // Bounded, so that a dead peer cannot hang shutdown.
  milliseconds linger{2000};
  // ZMQ_HANDSHAKE_IVL: a connection that has not finished the CURVE handshake by then is
  // dropped, so half-open scanners cannot hold resources on the head's public port.
  milliseconds handshake_timeout{10000};
  // ZMQ_TCP_KEEPALIVE*: the OS finds dead TCP connections (a vanished machine) after
  // idle + interval × count seconds. ZMTP heartbeats (ZMQ_HEARTBEAT_IVL) are deliberately
  // off: libzmq 4.3.4 aborts (`!_io_error`, stream_engine_base.cpp:331) when a heartbeat
  // timer fires on a connection whose input it stopped because the receive queue was full,
  // which is what a peer that is sent more than it reads produces. xloco's own HEARTBEAT
  // messages find silent peers; the transport never stops reading.
  int keepalive_idle_s = 60;
  int keepalive_interval_s = 10;
  int keepalive_count = 6;
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
  // What a provider may send and be sent; the head narrows them to its model (set_limits).
  // A frame over max_frame_bytes is refused at its stream's start, before any of it is
  // stored, and the provider stays connected.
  TransportLimits limits{std::int64_t{1} << 30, -1};
  // CURVE handshakes admitted per allow-listed key per minute (a burst of this many, then one
  // every 60 / this seconds): a key that reconnects faster is refused at the handshake, so
  // one key cannot pile up connections on the head.
  int max_handshakes_per_minute = 12;
  LinkOptions link;
};

struct ClientOptions {
  std::string connect;            // the head's endpoint, tcp://HOST:PORT
  std::string server_public_key;  // the head's public key (Z85); CURVE mode
  KeyPair key;                    // this provider's key pair; CURVE mode
  // ZMQ_ROUTING_ID in insecure mode only: the name the head knows this provider by. With
  // CURVE the head names a provider by its allow-listed key instead, which cannot be forged.
  std::string name;
  // None by default: the head (trusted, authenticated) sends whole model states.
  TransportLimits limits;
  // ZMQ_RECONNECT_IVL / _MAX: retry fast after a blip, back off to the max while the head is
  // down, so a restarted head is rejoined within seconds without a storm of SYNs.
  milliseconds reconnect_interval{100};
  milliseconds reconnect_interval_max{5000};
  LinkOptions link;
};

// Wire constants of this backend (both ends must agree; they are not options).
//
// A Frame travels as ZeroMQ messages of at most kChunkBytes each (wire.h). libzmq's CURVE copies and encrypts each part through fresh buffers of the part's
// size: for 1 MiB parts those stay in cache and reuse heap memory, while one 64 MiB part
// faults in new pages for every copy (4.6x less CPU per byte with glibc's default malloc;
// experiments/RESULTS.md, issue 4).
inline constexpr std::size_t kChunkBytes = std::size_t{1} << 20;
// CURVE wraps each part in a MESSAGE command 33 bytes longer than the plaintext
// (16-byte command header and nonce, flags byte, 16-byte MAC); ZMQ_MAXMSGSIZE sees that size.
inline constexpr std::int64_t kCurveFrameOverhead = 33;

}  // namespace xloco::net::zeromq
