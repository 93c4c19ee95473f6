// How a Message maps onto ZeroMQ messages. Each ZeroMQ message starts with a small header part
// (format version, kind) and is one of:
//   WHOLE  [2, 0, u64 size × n] + one part per frame: a message of at most kChunkBytes
//   START  [2, 1, u64 stream, u64 size × n]: a bigger message begins; its bytes follow as
//   CHUNK  [2, 2, u64 stream, u64 offset] + one part of at most kChunkBytes, cut per frame
// Every ZeroMQ message is thus at most one chunk long, so the high-water marks (counted in
// messages) bound what each queue holds, a small urgent message can pass between two chunks
// of a long transfer, and a receiver refuses a stream whose declared sizes are over its limit
// at START, before it stores any of it. Frames go out without copies; small frames come back
// without copies, big ones are assembled once as their chunks arrive. The socket code is in
// transport.cpp; this file only shapes and checks the parts.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "net/frame.h"
#include "net/outbox.h"
#include "net/transport.h"

namespace xloco::net::zeromq {

// What happened to a ZeroMQ send of one unit.
enum class UnitStatus {
  kTaken,    // the socket took it
  kBlocked,  // the peer's queue is at its high-water mark: try again later
  kNoPeer,   // the peer is gone (ROUTER_MANDATORY)
};

// Sends the next unit of `item` (after a routing-id part when given, ROUTER), without
// waiting: the whole message, or a stream's START, or its next chunk. `stream` names the
// item's stream (the sender numbers them). Reports how many of the item's bytes went and
// whether the item is done.
struct UnitResult {
  UnitStatus status = UnitStatus::kTaken;
  std::size_t bytes = 0;
  bool done = false;
};
UnitResult send_unit(::zmq::socket_t& socket, const std::string* routing_id, Outbox::Item& item,
                     std::uint64_t stream);

// Whether `message` goes as one ZeroMQ message (WHOLE) rather than as a stream.
bool fits_one_chunk(const Message& message);

// A stream being received from one peer.
class Reassembly {
 public:
  // Takes one received ZeroMQ message, parts[first] being its header. Returns a whole Message
  // when one is complete; nullopt with `error` empty for a chunk taken, or with `error` saying
  // why the ZeroMQ message (and any stream it belongs to) was dropped.
  // `max_frames` (< 0: the wire's own cap) bounds the frames of one message.
  std::optional<Message> take(std::vector<::zmq::message_t>& parts, std::size_t first,
                              std::int64_t max_frame_bytes, std::string& error,
                              std::int64_t max_frames = -1);
  std::size_t held_bytes() const { return received_; }  // of a stream in progress
  std::uint64_t skipped_chunks() const { return skipped_; }  // of refused streams

 private:
  std::optional<Message> start(const std::uint8_t* in, std::size_t size, std::size_t parts,
                               std::int64_t max_frame_bytes, std::size_t max_frames,
                               std::string& error);
  std::optional<Message> chunk(const std::uint8_t* in, std::size_t size,
                               std::vector<::zmq::message_t>& parts, std::size_t first,
                               std::string& error);
  void reset();

  bool active_ = false;
  std::uint64_t stream_ = 0;
  std::optional<std::uint64_t> refused_;  // a stream refused at its START: its chunks go quietly
  std::uint64_t skipped_ = 0;
  std::vector<std::uint64_t> sizes_;
  std::vector<std::shared_ptr<std::uint8_t>> buffers_;  // allocated as their first chunk comes
  std::uint64_t total_ = 0, received_ = 0;
};

}  // namespace xloco::net::zeromq
