// Protocol cases shared by the encode/decode tests and the transport tests: one envelope per
// message type, and one malformed message per ProtocolErrorKind (plus a few nastier ones).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "net/protocol.h"

namespace xloco::net::test {

inline const std::string kRun = "run-7";
inline constexpr std::size_t kAllErrorKinds = 10;  // members of ProtocolErrorKind

std::vector<Envelope> sample_envelopes();

// Checks with doctest that two envelopes are equal field by field.
void check_same(const Envelope& sent, const Envelope& got);

struct MalformedCase {
  std::string name;
  Message message;
  ProtocolErrorKind kind;
};
std::vector<MalformedCase> malformed_cases();

// The kind decode() throws for `message`, or nullopt if it accepts it.
std::optional<ProtocolErrorKind> decode_error_kind(const Message& message);

}  // namespace xloco::net::test
