// Settings of the in-process backend, the counterpart of zmq/options.h.
#pragma once

#include <cstddef>

namespace xloco::net::inproc {

struct NetworkOptions {
  // Messages that may wait at one receiving end (in flight or delayed included); beyond them
  // a sender's messages wait in its outbox, as ZMQ_SNDHWM + ZMQ_RCVHWM make them over ZeroMQ.
  std::size_t queue_capacity = 8;
};

// Which messages of a provider a fault applies to.
enum class Direction {
  kFromPeer,  // the provider's messages to the head
  kToPeer,    // the head's messages to the provider
  kBoth,
};

}  // namespace xloco::net::inproc
