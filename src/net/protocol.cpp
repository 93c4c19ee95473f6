#include "net/protocol.h"

#include <cmath>

#include <array>
#include <type_traits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/json_text.h"
#include "common/text.h"

namespace xloco::net {
namespace {

using nlohmann::json;

constexpr std::array<const char*, std::variant_size_v<Body>> kTypeNames = {
    "HELLO", "WELCOME", "HEARTBEAT", "ROUND_START", "CONTRIBUTION", "UPDATE", "BYE", "ERROR"};

// Same order as RefusalCode.
constexpr std::array<const char*, 11> kRefusalNames = {
    "malformed", "config_hash", "full", "bad_shard", "rejoin", "future_round", "bad_frame",
    "bad_tokens", "outlier", "low_score", "unexpected"};
static_assert(kRefusalNames.size() == static_cast<std::size_t>(RefusalCode::kUnexpected) + 1,
              "one wire name per RefusalCode");

// The enum value whose wire name (names[value]) is `name`.
template <typename E, std::size_t N>
std::optional<E> parse_name(const std::array<const char*, N>& names, std::string_view name) {
  for (std::size_t i = 0; i < N; ++i) {
    if (name == names[i]) return static_cast<E>(i);
  }
  return std::nullopt;
}

// A peer's JSON value quoted in a refusal: serialised without throwing, escaped, bounded.
std::string shown(const json& value) { return common::printable(common::json_dump(value), 96); }

[[noreturn]] void fail(ProtocolErrorKind kind, const std::string& what) {
  throw ProtocolError(kind, fmt::format("protocol error ({}): {}", to_string(kind), what));
}

const json& field(const json& header, const char* name) {
  const auto it = header.find(name);
  if (it == header.end()) fail(ProtocolErrorKind::kMissingField, fmt::format("no \"{}\"", name));
  return *it;
}

std::uint64_t unsigned_field(const json& header, const char* name) {
  const json& value = field(header, name);
  if (!value.is_number_unsigned()) {
    fail(ProtocolErrorKind::kBadField,
         fmt::format("\"{}\" must be a non-negative integer, got {}", name, shown(value)));
  }
  return value.get<std::uint64_t>();
}

double nonnegative_field(const json& header, const char* name) {
  const json& value = field(header, name);
  if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < 0) {
    fail(ProtocolErrorKind::kBadField,
         fmt::format("\"{}\" must be a finite number >= 0, got {}", name, shown(value)));
  }
  return value.get<double>();
}

std::string string_field(const json& header, const char* name) {
  const json& value = field(header, name);
  if (!value.is_string()) {
    fail(ProtocolErrorKind::kBadField,
         fmt::format("\"{}\" must be a string, got {}", name, shown(value)));
  }
  return value.get<std::string>();
}

// Per body: header fields, binary frames, and the way back. One overload set per direction
// keeps every type's wire shape on a few adjacent lines.
void write(const Hello& m, json& h, Message&) {
  h["provider"] = m.provider;
  h["config_hash"] = m.config_hash;
  h["tokens"] = m.tokens;
  h["theta_pub_hash"] = m.theta_pub_hash;
  h["shard"] = m.shard;
}
void write(const Welcome& m, json& h, Message& frames) {
  h["shard_index"] = m.shard_index;
  h["shard_count"] = m.shard_count;
  frames.push_back(m.state);
}
void write(const Heartbeat& m, json& h, Message&) {
  h["step"] = m.step;
  h["tokens_per_s"] = m.tokens_per_s;
}
void write(const RoundStart&, json&, Message&) {}
void write(const Contribution& m, json& h, Message& frames) {
  h["tokens"] = m.tokens;
  h["compute_s"] = m.compute_s;
  if (m.train_loss >= 0) h["train_loss"] = m.train_loss;
  frames.push_back(m.payload);
}
void write(const Update& m, json& h, Message& frames) {
  if (!m.parts.empty()) h["parts"] = m.parts.size();
  frames.push_back(m.payload);
  frames.insert(frames.end(), m.parts.begin(), m.parts.end());
}
void write(const Bye& m, json& h, Message&) { h["reason"] = m.reason; }
void write(const ErrorReply& m, json& h, Message&) {
  h["code"] = to_string(m.code);
  h["reason"] = m.reason;
}

template <typename T> constexpr std::size_t kBinaryFrames = 0;
template <> constexpr std::size_t kBinaryFrames<Welcome> = 1;
template <> constexpr std::size_t kBinaryFrames<Contribution> = 1;
template <> constexpr std::size_t kBinaryFrames<Update> = 1;

// The binary frames a message of type T carries: fixed, but for an UPDATE's relayed parts.
template <typename T>
std::size_t binary_frames(const json&) { return kBinaryFrames<T>; }
template <>
std::size_t binary_frames<Update>(const json& h) {
  if (!h.contains("parts")) return 1;
  const auto parts = unsigned_field(h, "parts");
  if (parts == 0 || parts > kMaxUpdateParts) {
    fail(ProtocolErrorKind::kBadField,
         fmt::format("\"parts\" {} is not between 1 and {}", parts, kMaxUpdateParts));
  }
  return 1 + parts;
}

// `frames` are the binary frames, already counted.
Hello read(const json& h, const Message&, Hello*) {
  Hello m{string_field(h, "provider"), string_field(h, "config_hash"), unsigned_field(h, "tokens"),
          string_field(h, "theta_pub_hash")};
  if (m.theta_pub_hash.size() > 128) {
    fail(ProtocolErrorKind::kBadField,
         fmt::format("\"theta_pub_hash\" of {} bytes is not a hash", m.theta_pub_hash.size()));
  }
  const json& shard = field(h, "shard");
  if (!shard.is_number_integer() || shard.get<std::int64_t>() < -1 ||
      shard.get<std::int64_t>() >= 65536) {
    fail(ProtocolErrorKind::kBadField,
         fmt::format("\"shard\" must be -1 (any) or a shard index below 65536, got {}", shown(shard)));
  }
  m.shard = shard.get<std::int64_t>();
  return m;
}
Welcome read(const json& h, const Message& frames, Welcome*) {
  Welcome w;
  w.state = frames[1];
  const auto index = unsigned_field(h, "shard_index");
  const auto count = unsigned_field(h, "shard_count");
  if (count == 0 || count > 65536 || index >= count) {
    fail(ProtocolErrorKind::kBadField,
         fmt::format("shard {} of {} is not a valid data shard", index, count));
  }
  w.shard_index = static_cast<std::uint32_t>(index);
  w.shard_count = static_cast<std::uint32_t>(count);
  return w;
}
Heartbeat read(const json& h, const Message&, Heartbeat*) {
  return {unsigned_field(h, "step"), nonnegative_field(h, "tokens_per_s")};
}
RoundStart read(const json&, const Message&, RoundStart*) { return {}; }
Contribution read(const json& h, const Message& frames, Contribution*) {
  Contribution c;
  c.tokens = unsigned_field(h, "tokens");
  c.compute_s = nonnegative_field(h, "compute_s");
  if (h.contains("train_loss")) c.train_loss = nonnegative_field(h, "train_loss");
  c.payload = frames[1];
  return c;
}
Update read(const json&, const Message& frames, Update*) {
  return {frames[1], Message(frames.begin() + 2, frames.end())};
}
Bye read(const json& h, const Message&, Bye*) { return {string_field(h, "reason")}; }
ErrorReply read(const json& h, const Message&, ErrorReply*) {
  const std::string code = string_field(h, "code");
  const auto parsed = parse_refusal_code(code);
  if (!parsed) fail(ProtocolErrorKind::kBadField, fmt::format("\"code\" {} names no refusal", shown(json(code))));
  return {*parsed, string_field(h, "reason")};
}

template <std::size_t I>
Body read_body(std::size_t index, const json& header, const Message& message) {
  if constexpr (I < std::variant_size_v<Body>) {
    if (index != I) return read_body<I + 1>(index, header, message);
    using T = std::variant_alternative_t<I, Body>;
    const std::size_t expected = binary_frames<T>(header);
    if (message.size() != 1 + expected) {
      fail(ProtocolErrorKind::kWrongFrameCount,
           fmt::format("{} carries {} binary frame(s), got {}", kTypeNames[I], expected,
                       message.size() - 1));
    }
    return read(header, message, static_cast<T*>(nullptr));
  } else {
    fail(ProtocolErrorKind::kUnknownType, "type index out of range");
  }
}

json parse_header(const Message& message) {
  if (message.empty() || message[0].empty()) fail(ProtocolErrorKind::kNoHeader, "no header frame");
  const Frame& frame = message[0];
  if (frame.size() > kMaxHeaderBytes) {
    fail(ProtocolErrorKind::kHeaderTooLarge,
         fmt::format("header is {} bytes, limit {}", frame.size(), kMaxHeaderBytes));
  }
  json header = json::parse(frame.view(), nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) fail(ProtocolErrorKind::kNotJson, "header is not valid JSON");
  if (!header.is_object()) fail(ProtocolErrorKind::kNotObject, "header is not a JSON object");
  return header;
}

}  // namespace

const char* to_string(MessageType type) {
  return kTypeNames.at(static_cast<std::size_t>(type));
}

std::optional<MessageType> parse_message_type(std::string_view name) {
  return parse_name<MessageType>(kTypeNames, name);
}

const char* to_string(RefusalCode code) {
  return kRefusalNames.at(static_cast<std::size_t>(code));
}

std::optional<RefusalCode> parse_refusal_code(std::string_view name) {
  return parse_name<RefusalCode>(kRefusalNames, name);
}

const char* to_string(ProtocolErrorKind kind) {
  switch (kind) {
    case ProtocolErrorKind::kNoHeader: return "no_header";
    case ProtocolErrorKind::kHeaderTooLarge: return "header_too_large";
    case ProtocolErrorKind::kNotJson: return "not_json";
    case ProtocolErrorKind::kNotObject: return "not_object";
    case ProtocolErrorKind::kWrongVersion: return "wrong_version";
    case ProtocolErrorKind::kUnknownType: return "unknown_type";
    case ProtocolErrorKind::kWrongRun: return "wrong_run";
    case ProtocolErrorKind::kMissingField: return "missing_field";
    case ProtocolErrorKind::kBadField: return "bad_field";
    case ProtocolErrorKind::kWrongFrameCount: return "wrong_frame_count";
  }
  return "unknown";
}

Message encode(const Envelope& envelope) {
  json header = {{"v", kProtocolVersion},
                 {"type", to_string(envelope.type())},
                 {"run", envelope.run},
                 {"round", envelope.round}};
  Message message(1);
  std::visit([&](const auto& body) { write(body, header, message); }, envelope.body);
  message[0] = Frame(std::string_view(common::json_dump(header)));
  return message;
}

Envelope decode(const Message& message, std::string_view expected_run) {
  const json header = parse_header(message);

  const json& version = field(header, "v");
  if (!version.is_number_integer()) {
    fail(ProtocolErrorKind::kBadField, fmt::format("\"v\" must be an integer, got {}", shown(version)));
  }
  if (version.get<std::int64_t>() != kProtocolVersion) {
    fail(ProtocolErrorKind::kWrongVersion,
         fmt::format("protocol version {}, this build speaks {}", shown(version), kProtocolVersion));
  }

  const std::string type_name = string_field(header, "type");
  const auto type = parse_message_type(type_name);
  if (!type) fail(ProtocolErrorKind::kUnknownType, fmt::format("unknown type \"{}\"", common::printable(type_name, 64)));

  Envelope envelope;
  envelope.run = string_field(header, "run");
  if (envelope.run != expected_run) {
    fail(ProtocolErrorKind::kWrongRun,
         fmt::format("message for run \"{}\", this is run \"{}\"", common::printable(envelope.run, 96), expected_run));
  }
  envelope.round = unsigned_field(header, "round");
  envelope.body = read_body<0>(static_cast<std::size_t>(*type), header, message);
  return envelope;
}

namespace {

// The header's `key`, when the message has a readable header that holds it.
std::optional<json> peek(const Message& message, const char* key) noexcept {
  try {
    if (message.empty() || message[0].size() > kMaxHeaderBytes) return std::nullopt;
    const json header = json::parse(message[0].view(), nullptr, false);
    if (!header.is_object()) return std::nullopt;
    const auto it = header.find(key);
    if (it == header.end()) return std::nullopt;
    return *it;
  } catch (...) {
    return std::nullopt;
  }
}

}  // namespace

std::optional<std::uint64_t> peek_round(const Message& message) noexcept {
  const auto round = peek(message, "round");
  if (!round || !round->is_number_unsigned()) return std::nullopt;
  return round->get<std::uint64_t>();
}

std::optional<MessageType> peek_type(const Message& message) noexcept {
  const auto type = peek(message, "type");
  if (!type || !type->is_string()) return std::nullopt;
  return parse_message_type(type->get<std::string>());
}

}  // namespace xloco::net
