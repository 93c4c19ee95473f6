#include "cases.h"

#include <doctest/doctest.h>

namespace xloco::net::test {
namespace {

Frame text(const std::string& s) { return Frame(std::string_view(s)); }

Message header(const std::string& json) { return {text(json)}; }

}  // namespace

std::vector<Envelope> sample_envelopes() {
  return {
      {kRun, 0, Hello{"alice", "cfg-3f2a", 1000, "h-9c", 2}},
      {kRun, 3, Welcome{text("full state bytes"), 2, 4}},
      {kRun, 3, Heartbeat{}},
      {kRun, 4, RoundStart{}},
      {kRun, 4, Contribution{65536, 1.5, text("int8 codec frame"), 2.25}},
      {kRun, 4, Update{text("fp32 update frame")}},
      {kRun, 5, Bye{"lease ended"}},
      {kRun, 5, ErrorReply{RefusalCode::kMalformed, "protocol error (wrong_run): this head runs run-7"}},
  };
}

void check_same(const Envelope& sent, const Envelope& got) {
  CHECK(got.run == sent.run);
  CHECK(got.round == sent.round);
  REQUIRE(got.type() == sent.type());
  std::visit(
      [&](const auto& expected) {
        using T = std::decay_t<decltype(expected)>;
        const T& actual = std::get<T>(got.body);
        if constexpr (std::is_same_v<T, Hello>) {
          CHECK(actual.provider == expected.provider);
          CHECK(actual.config_hash == expected.config_hash);
          CHECK(actual.tokens == expected.tokens);
          CHECK(actual.theta_pub_hash == expected.theta_pub_hash);
          CHECK(actual.shard == expected.shard);
        } else if constexpr (std::is_same_v<T, Welcome>) {
          CHECK(actual.state == expected.state);
          CHECK(actual.shard_index == expected.shard_index);
          CHECK(actual.shard_count == expected.shard_count);
        } else if constexpr (std::is_same_v<T, Contribution>) {
          CHECK(actual.tokens == expected.tokens);
          CHECK(actual.compute_s == expected.compute_s);
          CHECK(actual.payload == expected.payload);
          CHECK(actual.train_loss == expected.train_loss);
        } else if constexpr (std::is_same_v<T, Update>) {
          CHECK(actual.payload == expected.payload);
        } else if constexpr (std::is_same_v<T, Bye>) {
          CHECK(actual.reason == expected.reason);
        } else if constexpr (std::is_same_v<T, ErrorReply>) {
          CHECK(actual.code == expected.code);
          CHECK(actual.reason == expected.reason);
        }
      },
      sent.body);
}

std::vector<MalformedCase> malformed_cases() {
  using K = ProtocolErrorKind;
  const std::string ok = R"("v":1,"run":"run-7","round":3)";
  std::vector<MalformedCase> cases = {
      {"empty header frame", {Frame()}, K::kNoHeader},
      {"header over the limit",
       header("{" + ok + R"(,"type":"BYE","reason":")" + std::string(kMaxHeaderBytes, 'x') + "\"}"),
       K::kHeaderTooLarge},
      {"not JSON", header("{\"v\":1,"), K::kNotJson},
      {"binary garbage", {Frame(std::vector<std::uint8_t>{0xff, 0x00, 0xfe, 0x7b})}, K::kNotJson},
      {"JSON array", header("[1,2,3]"), K::kNotObject},
      {"deeply nested", header(std::string(4000, '[') + std::string(4000, ']')), K::kNotObject},
      {"version 2", header(R"({"v":2,"type":"HEARTBEAT","run":"run-7","round":3})"),
       K::kWrongVersion},
      {"unknown type", header("{" + ok + R"(,"type":"GOSSIP"})"), K::kUnknownType},
      {"another run", header(R"({"v":1,"type":"HEARTBEAT","run":"run-8","round":3})"),
       K::kWrongRun},
      {"no version", header(R"({"type":"HEARTBEAT","run":"run-7","round":3})"),
       K::kMissingField},
      {"no round", header(R"({"v":1,"type":"HEARTBEAT","run":"run-7"})"), K::kMissingField},
      {"HELLO without provider",
       header("{" + ok + R"(,"type":"HELLO","config_hash":"c","tokens":0})"), K::kMissingField},
      {"negative round", header(R"({"v":1,"type":"HEARTBEAT","run":"run-7","round":-1})"),
       K::kBadField},
      {"round as text", header(R"({"v":1,"type":"HEARTBEAT","run":"run-7","round":"3"})"),
       K::kBadField},
      {"version as text", header(R"({"v":"1","type":"HEARTBEAT","run":"run-7","round":3})"),
       K::kBadField},
      {"HELLO asking for shard -2",
       header("{" + ok + R"(,"type":"HELLO","provider":"a","config_hash":"c","tokens":0,"theta_pub_hash":"","shard":-2})"),
       K::kBadField},
      {"ERROR with a code that names no refusal",
       header("{" + ok + R"(,"type":"ERROR","code":"teapot","reason":"r"})"), K::kBadField},
      {"CONTRIBUTION without its frame", header("{" + ok + R"(,"type":"CONTRIBUTION","tokens":5})"),
       K::kWrongFrameCount},
      {"HEARTBEAT with a stray frame",
       {text("{" + ok + R"(,"type":"HEARTBEAT"})"), text("stray")}, K::kWrongFrameCount},
  };
  return cases;
}

std::optional<ProtocolErrorKind> decode_error_kind(const Message& message) {
  try {
    (void)decode(message, kRun);
    return std::nullopt;
  } catch (const ProtocolError& e) {
    return e.kind();
  }
}

}  // namespace xloco::net::test
