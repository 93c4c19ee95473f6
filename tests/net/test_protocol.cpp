// The protocol on its own: every message type encodes and decodes to itself, and every kind
// of malformed header is told apart. The same cases cross real transports in
// test_transport.cpp.
#include <doctest/doctest.h>

#include <set>

#include "cases.h"
#include "common/json_text.h"
#include "common/text.h"
#include "net/protocol.h"

namespace xloco::net::test {

TEST_SUITE("net.protocol") {
  TEST_CASE("every message type round-trips") {
    const auto envelopes = sample_envelopes();
    REQUIRE(envelopes.size() == std::variant_size_v<Body>);
    std::set<MessageType> types;
    for (const Envelope& envelope : envelopes) {
      CAPTURE(to_string(envelope.type()));
      const Envelope back = decode(encode(envelope), kRun);
      check_same(envelope, back);
      types.insert(back.type());
    }
    CHECK(types.size() == std::variant_size_v<Body>);
  }

  TEST_CASE("the header frame is the JSON of design section 7") {
    Envelope envelope{kRun, 7, Contribution{1234, 0.25, Frame(std::string_view("codec"))}};
    const Message message = encode(envelope);
    REQUIRE(message.size() == 2);
    const std::string header(message[0].view());
    CHECK(header.find("\"v\":1") != std::string::npos);
    CHECK(header.find("\"type\":\"CONTRIBUTION\"") != std::string::npos);
    CHECK(header.find("\"run\":\"run-7\"") != std::string::npos);
    CHECK(header.find("\"round\":7") != std::string::npos);
    CHECK(header.find("\"tokens\":1234") != std::string::npos);
    CHECK(message[1].view() == "codec");
    CHECK(message[1].data() == std::get<Contribution>(envelope.body).payload.data());  // shared
  }

  TEST_CASE("type names map both ways") {
    for (int i = 0; i < static_cast<int>(std::variant_size_v<Body>); ++i) {
      const auto type = static_cast<MessageType>(i);
      CHECK(parse_message_type(to_string(type)) == type);
    }
    CHECK_FALSE(parse_message_type("hello").has_value());
    CHECK(std::string(to_string(MessageType::kRoundStart)) == "ROUND_START");
  }

  TEST_CASE("each malformed header gets its own error kind") {
    std::set<ProtocolErrorKind> kinds;
    for (const MalformedCase& bad : malformed_cases()) {
      CAPTURE(bad.name);
      const auto kind = decode_error_kind(bad.message);
      REQUIRE(kind.has_value());
      CHECK(*kind == bad.kind);
      kinds.insert(*kind);
    }
    CHECK(kinds.size() == kAllErrorKinds);
  }

  TEST_CASE("a contribution's train_loss: optional, and refused unless finite and >= 0") {
    Envelope with{kRun, 7, Contribution{1234, 0.25, Frame(std::string_view("codec")), 3.5}};
    CHECK(std::get<Contribution>(decode(encode(with), kRun).body).train_loss == 3.5);
    Envelope without{kRun, 7, Contribution{1234, 0.25, Frame(std::string_view("codec"))}};
    const Message plain = encode(without);
    CHECK(std::string(reinterpret_cast<const char*>(plain[0].data()), plain[0].size()).find("train_loss") ==
          std::string::npos);  // an old head reads what it always read
    CHECK(std::get<Contribution>(decode(plain, kRun).body).train_loss < 0);
    for (const char* bad : {"-1", "\"x\"", "1e999", "null"}) {
      CAPTURE(bad);
      Message m = encode(with);
      std::string header(reinterpret_cast<const char*>(m[0].data()), m[0].size());
      const auto at = header.find("\"train_loss\":");
      REQUIRE(at != std::string::npos);
      const auto end = header.find_first_of(",}", at);
      header = header.substr(0, at) + "\"train_loss\":" + bad + header.substr(end);
      m[0] = Frame(std::string_view(header));
      const auto kind = decode_error_kind(m);
      CHECK((kind == ProtocolErrorKind::kBadField || kind == ProtocolErrorKind::kNotJson));
    }
  }

  TEST_CASE("errors name their kind and never escape as anything but ProtocolError") {
    try {
      (void)decode({Frame(std::string_view("{\"v\":9}"))}, kRun);
      FAIL("decode accepted version 9");
    } catch (const ProtocolError& e) {
      CHECK(e.kind() == ProtocolErrorKind::kWrongVersion);
      CHECK(std::string(e.what()).find("wrong_version") != std::string::npos);
    }
    CHECK_THROWS_AS((void)decode({}, kRun), ProtocolError);
  }

  TEST_CASE("a peer's text is quoted escaped and bounded, and serialising it never throws") {
    // printable: printable ASCII stays, every other byte (and '\\') is \xNN, the rest is cut.
    CHECK(common::printable("plain text 1.0") == "plain text 1.0");
    CHECK(common::printable("a\xff\x1b[2J\n\\") == "a\\xff\\x1b[2J\\x0a\\\\");
    CHECK(common::printable(std::string(1000, 'x'), 10) == "xxxxxxxxxx...(990 more bytes)");
    CHECK(common::is_printable("transformer.h.0.attn.c_attn.weight"));
    CHECK_FALSE(common::is_printable("caf\xc3\xa9"));
    // nlohmann's dump() throws on bytes that are not UTF-8; json_dump writes U+FFFD instead.
    const nlohmann::json doc = {{"reason", std::string("tensor \xff\xfe")}};
    CHECK_THROWS((void)doc.dump());
    CHECK(common::json_dump(doc) == "{\"reason\":\"tensor \xef\xbf\xbd\xef\xbf\xbd\"}");
    // A refusal or a goodbye holding such bytes is encoded, not thrown.
    CHECK_NOTHROW((void)encode({kRun, 1, ErrorReply{RefusalCode::kBadFrame, "tensor \xff"}}));
    CHECK_NOTHROW((void)encode({kRun, 1, Bye{std::string("\xc3\x28")}}));
    // Decode errors quote a peer's fields escaped: no terminal escape reaches a log line.
    for (const char* header : {"{\"v\":1,\"type\":\"\\u001b[2J\",\"run\":\"run-7\",\"round\":1}",
                               "{\"v\":1,\"type\":\"BYE\",\"run\":\"\\u001b[2J\",\"round\":1,\"reason\":\"x\"}",
                               "{\"v\":\"\\u001b[2J\"}"}) {
      CAPTURE(header);
      try {
        (void)decode({Frame(std::string_view(header))}, kRun);
        FAIL("decode accepted it");
      } catch (const ProtocolError& e) {
        CHECK(std::string(e.what()).find('\x1b') == std::string::npos);
        CHECK(std::string(e.what()).find("[2J") != std::string::npos);
      }
    }
  }

  TEST_CASE("peek_round reads a round without trusting the message") {
    CHECK(peek_round(encode({kRun, 42, Heartbeat{}})) == 42u);
    CHECK_FALSE(peek_round({}).has_value());
    CHECK_FALSE(peek_round({Frame(std::string_view("{\"round\":-1}"))}).has_value());
    CHECK_FALSE(peek_round({Frame(std::string_view("\xff\xfe"))}).has_value());
  }
}

}  // namespace xloco::net::test
