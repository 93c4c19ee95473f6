// Transport: the one interface that outer-loop code uses to move multipart messages between
// the head and its providers. Backends (zmq/ for real links, inproc/ for tests with fault
// injection) live in sibling folders; this header knows neither, nor any message type.
//
// Peers: on the head, a peer is named by its authenticated identity (the allow-list name of
// its key; in insecure mode the name it claims). A provider has one peer, kHeadPeer.
// Rules: expected non-events (timeout, absent peer, full queue) are return values and leave
// the transport usable; a TransportError means the transport is broken and must be rebuilt.
// A Transport is used by one thread at a time, like the ZeroMQ socket under it.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "net/frame.h"

namespace xloco::net {

using PeerId = std::string;

// The name a provider uses for its only peer.
inline const PeerId kHeadPeer = "head";

struct SendOptions {
  std::chrono::milliseconds timeout{30000};  // how long a full queue may block send()
};

enum class SendStatus {
  kSent,     // queued for delivery (delivery itself is not confirmed: use a reply for that)
  kNoPeer,   // no such peer is connected now; the message was dropped
  kTimeout,  // the peer's queue stayed full for the whole timeout; the message was dropped
};

const char* to_string(SendStatus status);

struct Received {
  PeerId peer;         // who sent it
  Message message;     // at least one frame
  std::string address; // the sender's IP address as this end sees it; empty where unknown
};

class Transport {
 public:
  virtual ~Transport() = default;
  Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Sends one multipart message; `message` must have at least one frame. Frames are shared,
  // not copied, so the caller may keep and resend them.
  [[nodiscard]] virtual SendStatus send(const PeerId& peer, const Message& message,
                                        const SendOptions& options = {}) = 0;

  // Waits up to `timeout` for a whole message; nullopt when none arrived.
  [[nodiscard]] virtual std::optional<Received> receive(std::chrono::milliseconds timeout) = 0;

  // Waits up to `timeout` until a message is waiting. (receive() may still drop it, and log
  // why, if its transport framing is malformed: never the case between xloco ends.)
  [[nodiscard]] virtual bool poll(std::chrono::milliseconds timeout) = 0;

  // Where this end listens or connects (for the head, the bound address with its real port).
  virtual std::string endpoint() const = 0;
};

}  // namespace xloco::net
