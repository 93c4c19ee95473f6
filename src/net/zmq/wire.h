// How a Message maps onto the parts of one ZeroMQ multipart message: a layout part (format
// version, then each frame's size), then every frame cut into parts of at most kChunkBytes.
// Frames go out without copies; small frames come back without copies, big ones are
// assembled once. The socket code is in transport.cpp; this file only shapes the parts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "net/frame.h"
#include "net/transport.h"

namespace xloco::net::zeromq {

// Sends `message`, after a routing-id part when given (ROUTER). Only the first part can
// block or fail to route, as libzmq checks the high-water mark and the peer at message
// boundaries; the send timeout is the socket's ZMQ_SNDTIMEO.
SendStatus send_message(::zmq::socket_t& socket, const std::string* routing_id,
                        const Message& message);

// Rebuilds the frames from parts[first] (the layout part) on. On a malformed or oversized
// message returns nullopt and says why in `error`; nothing is allocated before the layout
// has been checked against the parts actually received.
std::optional<Message> unpack_message(std::vector<::zmq::message_t>& parts, std::size_t first,
                                      std::int64_t max_frame_bytes, std::string& error);

}  // namespace xloco::net::zeromq
