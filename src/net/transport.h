// Transport: the one interface that outer-loop code uses to move multipart messages between
// the head and its providers. Backends (zmq/ for real links, inproc/ for tests with fault
// injection) live in sibling folders; this header knows neither, nor any message type.
//
// Peers: on the head, a peer is named by its authenticated identity (the allow-list name of
// its key; in insecure mode the name it claims). A provider has one peer, kHeadPeer.
// Rules: send() never waits. It queues the message for its peer (net/outbox.h) and the
// transport moves queues on as each peer's link takes them, inside send(), receive() and
// poll(), so one slow or silent peer delays only its own messages. Expected non-events (no
// message yet, an absent peer, a peer over its queue budget) are return values and leave the
// transport usable; a TransportError means the transport is broken and must be rebuilt.
// A Transport is used by one thread at a time, like the ZeroMQ socket under it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "net/frame.h"

namespace xloco::net {

using PeerId = std::string;

// The name a provider uses for its only peer.
inline const PeerId kHeadPeer = "head";

struct SendOptions {
  // May pass a message whose transfer to the same peer has begun (heartbeats): a long
  // transfer must not look like silence. Urgent messages keep their order among themselves,
  // the others among themselves; a peer keeps only its newest few urgent ones waiting.
  bool urgent = false;
};

enum class SendStatus {
  kSent,    // queued for delivery (delivery itself is not confirmed: use a reply for that)
  kNoPeer,  // no such peer is connected now; the message was dropped
  kFull,    // the peer's queue is over its byte budget (it does not keep up); dropped
};

const char* to_string(SendStatus status);

// How the link to one peer keeps up: what send() accepted that the link has not taken yet.
struct LinkState {
  std::size_t queued_bytes = 0;
  std::size_t queued_messages = 0;
  // When the link last took bytes for this peer, or when its queue last went from empty to
  // not empty; a queue that has not moved since is stalled.
  std::chrono::steady_clock::time_point last_progress{};
  // Since the peer's queue was last dropped: bytes send() accepted, and bytes the link took.
  // A message has left once taken_bytes reaches enqueued_bytes as it was just after its send.
  std::uint64_t enqueued_bytes = 0;
  std::uint64_t taken_bytes = 0;
};

// What a transport accepts and holds per peer. The head sets them from its model (a frame is
// at most the parameters in fp32 plus its tables); -1 is no limit.
struct TransportLimits {
  std::int64_t max_frame_bytes = -1;  // a bigger incoming frame is refused before any is stored
  std::int64_t queue_bytes = -1;      // per-peer send budget (beyond it send() returns kFull)
  // Frames in one incoming message: more is refused at its start, before anything is stored
  // (-1: any the wire carries, an UPDATE's 2 + protocol.h kMaxUpdateParts). The head takes
  // nothing longer than a CONTRIBUTION (2), so a peer cannot make it hold thousands of buffers.
  std::int64_t max_frames = -1;
};

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

  // Queues one multipart message; `message` must have at least one frame. Frames are shared,
  // not copied, so the caller may keep and resend them.
  [[nodiscard]] virtual SendStatus send(const PeerId& peer, const Message& message,
                                        const SendOptions& options = {}) = 0;

  // Waits up to `timeout` for a whole message; nullopt when none arrived.
  [[nodiscard]] virtual std::optional<Received> receive(std::chrono::milliseconds timeout) = 0;

  // Waits up to `timeout` until a message may be waiting. (receive() may still find none: a
  // part of a larger message, or one it drops, and logs why, as malformed or over a limit.)
  [[nodiscard]] virtual bool poll(std::chrono::milliseconds timeout) = 0;

  // Where this end listens or connects (for the head, the bound address with its real port).
  virtual std::string endpoint() const = 0;

  // The send queue of `peer` (all zero for a peer with nothing queued, or unknown).
  virtual LinkState link_state(const PeerId& peer) const = 0;
  // Forgets what is queued for `peer` (one declared dead), freeing the frames it held.
  virtual void drop_queue(const PeerId& peer) = 0;
  virtual void set_limits(const TransportLimits& limits) = 0;
};

}  // namespace xloco::net
