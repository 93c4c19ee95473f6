// Typed errors of src/net. Expected non-events (a timeout, an absent peer) are return values,
// never exceptions; these are for real failures the caller may want to tell apart.
// ProtocolError (a bad message) lives in protocol.h next to the messages it checks.
#pragma once

#include "common/error.h"

namespace xloco::net {

// Base of every src/net error, so a caller can catch "the network part failed".
class NetError : public common::Error {
 public:
  using common::Error::Error;
};

// A socket or context call failed (bad endpoint, address in use, library error). The transport
// that threw is unusable afterwards: destroy it and make a new one (ZeroMQ reconnects by
// itself, so this is rare after construction).
class TransportError : public NetError {
 public:
  using NetError::NetError;
};

// A key file is missing, malformed, or too widely readable; the message says how to fix it.
class KeyError : public NetError {
 public:
  using NetError::NetError;
};

}  // namespace xloco::net
