// What only the ZeroMQ backend can show: CURVE and the ZAP allow-list keep strangers out,
// ZMQ_MAXMSGSIZE protects the head, and a provider survives a head restart. All on 127.0.0.1
// with ports picked by the OS.
#include <doctest/doctest.h>

#include "cases.h"
#include "helpers.h"

namespace xloco::net::test {
namespace {

struct Head {
  Capture capture;
  KeyPair key = generate_keypair();
  KeyPair alice = generate_keypair();
  KeyPair bob = generate_keypair();
  std::unique_ptr<zeromq::Server> server;

  explicit Head(std::int64_t max_frame_bytes = std::int64_t{1} << 30) {
    start("tcp://127.0.0.1:0", max_frame_bytes);
  }
  void start(const std::string& bind, std::int64_t max_frame_bytes = std::int64_t{1} << 30) {
    zeromq::ServerOptions options;
    options.bind = bind;
    options.key = key;
    options.allow.add("alice", alice.public_key);
    options.allow.add("bob", bob.public_key);
    options.max_frame_bytes = max_frame_bytes;
    options.link = ZmqBackend::test_link(capture);
    server = std::make_unique<zeromq::Server>(std::move(options));
  }
  zeromq::ClientOptions client(const KeyPair& pair) const {
    zeromq::ClientOptions options;
    options.connect = server->endpoint();
    options.server_public_key = key.public_key;
    options.key = pair;
    options.reconnect_interval_max = 200ms;
    options.link = ZmqBackend::test_link(capture);
    return options;
  }
  // A hand-made CURVE client with `pair`'s allow-listed key that ignores xloco's framing.
  ::zmq::socket_t raw_dealer(::zmq::context_t& context, const KeyPair& pair) const {
    ::zmq::socket_t raw(context, ::zmq::socket_type::dealer);
    raw.set(::zmq::sockopt::linger, 0);
    raw.set(::zmq::sockopt::curve_serverkey, key.public_key);
    raw.set(::zmq::sockopt::curve_publickey, pair.public_key);
    raw.set(::zmq::sockopt::curve_secretkey, pair.secret_key);
    raw.connect(server->endpoint());
    return raw;
  }
};

Message heartbeat(std::uint64_t round = 0) { return encode({kRun, round, Heartbeat{}}); }

}  // namespace

TEST_SUITE("net.zmq") {
  TEST_CASE("the head binds to a port the OS picked and reports it") {
    Head head;
    const std::string endpoint = head.server->endpoint();
    CHECK(endpoint.rfind("tcp://127.0.0.1:", 0) == 0);
    CHECK(endpoint != "tcp://127.0.0.1:0");
    CHECK(head.capture.sink->count("CURVE, 2 allow-listed provider keys") == 1);
  }

  TEST_CASE("a provider whose key is not listed gets nothing through, and the head logs it") {
    Head head;
    const KeyPair mallory = generate_keypair();
    zeromq::Client intruder(head.client(mallory));
    REQUIRE(intruder.send(kHeadPeer, encode({kRun, 0, Hello{"alice", "c", 0, ""}})) ==
            SendStatus::kSent);
    CHECK(head.capture.sink->wait_for(mallory.public_key, kPatience));
    CHECK(head.capture.sink->count("is not on the allow-list") >= 1);
    CHECK(head.server->refused() >= 1);
    CHECK_FALSE(head.server->receive(kQuiet).has_value());
    CHECK(head.server->send("alice", heartbeat()) == SendStatus::kNoPeer);
    CHECK_FALSE(intruder.receive(0ms).has_value());

    // The head still serves the listed provider meanwhile.
    zeromq::Client alice(head.client(head.alice));
    REQUIRE(alice.send(kHeadPeer, heartbeat()) == SendStatus::kSent);
    auto got = head.server->receive(kPatience);
    REQUIRE(got.has_value());
    CHECK(got->peer == "alice");
    CHECK(got->address == "127.0.0.1");  // where it came from, for the head's status
    CHECK(head.capture.sink->count(mallory.public_key) >= 1);
    CHECK(head.capture.sink->count(std::string("admitted provider alice (key ") +
                                   head.alice.public_key) == 1);
  }

  TEST_CASE("a plaintext client cannot talk to a CURVE head") {
    Head head;
    zeromq::ClientOptions options = head.client(head.alice);
    options.link.insecure = true;
    options.name = "alice";
    zeromq::Client plaintext(options);
    REQUIRE(plaintext.send(kHeadPeer, heartbeat()) == SendStatus::kSent);
    // Whichever end sees the mismatch first hangs up, so the head logs either the mismatch
    // or the hang-up; both are a failed handshake.
    CHECK(head.capture.sink->wait_for("handshake failed", kPatience));
    CHECK_FALSE(head.server->receive(kQuiet).has_value());
    CHECK_FALSE(plaintext.receive(0ms).has_value());
  }

  TEST_CASE("a client with a wrong server key is not admitted") {
    Head head;
    zeromq::ClientOptions options = head.client(head.alice);
    options.server_public_key = generate_keypair().public_key;
    zeromq::Client confused(options);
    REQUIRE(confused.send(kHeadPeer, heartbeat()) == SendStatus::kSent);
    CHECK(head.capture.sink->wait_for("handshake failed", kPatience));
    CHECK_FALSE(head.server->receive(kQuiet).has_value());
  }

  TEST_CASE("a frame over max_frame_bytes is dropped without harming anyone") {
    constexpr std::int64_t kLimit = 3 << 20;  // spans several parts on the wire
    Head head(kLimit);
    zeromq::Client alice(head.client(head.alice));
    zeromq::Client bob(head.client(head.bob));

    // Exactly at the limit passes: the limit is on the frame, not on its wire form.
    const Frame at_limit(pattern(kLimit, 3));
    REQUIRE(alice.send(kHeadPeer, encode({kRun, 1, Update{at_limit}})) == SendStatus::kSent);
    auto first = head.server->receive(kPatience);
    REQUIRE(first.has_value());
    CHECK(std::get<Update>(decode(first->message, kRun).body).payload == at_limit);

    REQUIRE(alice.send(kHeadPeer, encode({kRun, 2, Update{Frame(pattern(kLimit + 1, 4))}})) ==
            SendStatus::kSent);
    REQUIRE(bob.send(kHeadPeer, heartbeat(2)) == SendStatus::kSent);
    auto got = head.server->receive(kPatience);
    REQUIRE(got.has_value());
    CHECK(got->peer == "bob");
    // Alice stays connected: her next message is the next thing the head gets from her, and
    // as a connection keeps order, her oversize frame was dropped (and logged) before it.
    REQUIRE(alice.send(kHeadPeer, heartbeat(3)) == SendStatus::kSent);
    auto next = head.server->receive(kPatience);
    REQUIRE(next.has_value());
    CHECK(next->peer == "alice");
    CHECK(decode(next->message, kRun).round == 3);
    CHECK(head.capture.sink->count("dropped a message from alice: a frame of 3145729 bytes is "
                                   "over max_frame_bytes (3145728)") == 1);
  }

  TEST_CASE("a part over ZMQ_MAXMSGSIZE costs its sender the connection, and only that") {
    Head head;
    head.capture.logger->set_level(spdlog::level::debug);
    zeromq::Client bob(head.client(head.bob));
    ::zmq::context_t context;
    ::zmq::socket_t raw = head.raw_dealer(context, head.alice);
    const std::vector<std::uint8_t> big = pattern(zeromq::kChunkBytes + 1, 5);
    REQUIRE(raw.send(::zmq::buffer(big), ::zmq::send_flags::none));

    for (std::uint64_t round = 1; round <= 3; ++round) {
      REQUIRE(bob.send(kHeadPeer, heartbeat(round)) == SendStatus::kSent);
      auto got = head.server->receive(kPatience);
      REQUIRE(got.has_value());
      CHECK(got->peer == "bob");
      REQUIRE(head.server->send("bob", heartbeat(round)) == SendStatus::kSent);
      REQUIRE(bob.receive(kPatience).has_value());
    }
    // libzmq cut the connection on the part's size, before xloco could see the message.
    CHECK(head.capture.sink->wait_for("a peer disconnected", kPatience));
    CHECK_FALSE(head.server->receive(kQuiet).has_value());
    CHECK(head.capture.sink->count("dropped a message") == 0);
  }

  TEST_CASE("a malformed layout is dropped and logged, and the sender stays connected") {
    Head head;
    ::zmq::context_t context;
    ::zmq::socket_t raw = head.raw_dealer(context, head.alice);
    const std::uint8_t lying_layout[] = {1, 0, 0, 0x10, 0, 0, 0, 0, 0};  // 1 MiB, no parts
    REQUIRE(raw.send(::zmq::buffer(lying_layout), ::zmq::send_flags::none));
    REQUIRE(raw.send(::zmq::str_buffer("garbage"), ::zmq::send_flags::none));
    const std::uint8_t good_layout[] = {1, 4, 0, 0, 0, 0, 0, 0, 0};
    REQUIRE(raw.send(::zmq::buffer(good_layout), ::zmq::send_flags::sndmore));
    REQUIRE(raw.send(::zmq::str_buffer("ping"), ::zmq::send_flags::none));
    auto got = head.server->receive(kPatience);
    REQUIRE(got.has_value());
    CHECK(got->peer == "alice");
    REQUIRE(got->message.size() == 1);
    CHECK(got->message[0].view() == "ping");
    CHECK(head.capture.sink->count("dropped a message from alice: the layout does not match the "
                                   "0 parts received") == 1);
    CHECK(head.capture.sink->count("dropped a message from alice: malformed layout part (7 "
                                   "bytes)") == 1);
  }

  TEST_CASE("a provider reconnects by itself after the head restarts on the same endpoint") {
    Head head;
    const std::string endpoint = head.server->endpoint();
    zeromq::Client alice(head.client(head.alice));
    REQUIRE(alice.send(kHeadPeer, heartbeat(1)) == SendStatus::kSent);
    REQUIRE(head.server->receive(kPatience).has_value());

    head.server.reset();
    head.start(endpoint);  // same port
    CHECK(head.server->endpoint() == endpoint);

    // A message written just as the old head died may be lost with its TCP connection, so
    // keep saying hello until the new head hears one; the client itself is never touched.
    std::optional<Received> got;
    const auto deadline = std::chrono::steady_clock::now() + kPatience;
    while (!got && std::chrono::steady_clock::now() < deadline) {
      REQUIRE(alice.send(kHeadPeer, heartbeat(2), {100ms}) != SendStatus::kNoPeer);
      got = head.server->receive(200ms);
    }
    REQUIRE(got.has_value());
    CHECK(got->peer == "alice");
    REQUIRE(head.server->send("alice", heartbeat(3)) == SendStatus::kSent);
    std::optional<Received> reply;
    while (!reply && std::chrono::steady_clock::now() < deadline) {
      reply = alice.receive(200ms);
      if (reply && decode(reply->message, kRun).round != 3) reply.reset();  // stale replies
    }
    REQUIRE(reply.has_value());
  }

  TEST_CASE("a send to a provider that left returns kNoPeer") {
    Head head;
    auto alice = std::make_unique<zeromq::Client>(head.client(head.alice));
    REQUIRE(alice->send(kHeadPeer, heartbeat()) == SendStatus::kSent);
    REQUIRE(head.server->receive(kPatience).has_value());
    alice.reset();
    SendStatus status = SendStatus::kSent;
    const auto deadline = std::chrono::steady_clock::now() + kPatience;
    while (status == SendStatus::kSent && std::chrono::steady_clock::now() < deadline) {
      status = head.server->send("alice", heartbeat(), {100ms});
      if (status == SendStatus::kSent) (void)head.server->poll(20ms);  // let the I/O thread see the FIN
    }
    CHECK(status == SendStatus::kNoPeer);
  }

  TEST_CASE("insecure mode works only when asked, and warns at every start") {
    Capture capture;
    zeromq::ServerOptions server_options;
    server_options.bind = "tcp://127.0.0.1:0";
    server_options.link = ZmqBackend::test_link(capture);
    CHECK_THROWS_AS(zeromq::Server{server_options}, KeyError);  // no keys, no insecure flag

    server_options.link.insecure = true;
    zeromq::Server head(server_options);
    zeromq::ClientOptions client_options;
    client_options.connect = head.endpoint();
    client_options.name = "alice";
    client_options.link = ZmqBackend::test_link(capture);
    CHECK_THROWS_AS(zeromq::Client{client_options}, KeyError);
    client_options.link.insecure = true;
    zeromq::Client alice(client_options);
    CHECK(capture.sink->count("INSECURE") == 2);

    REQUIRE(alice.send(kHeadPeer, heartbeat()) == SendStatus::kSent);
    auto got = head.receive(kPatience);
    REQUIRE(got.has_value());
    CHECK(got->peer == "alice");  // claimed, not proven: that is what insecure means
  }

  TEST_CASE("the head refuses to start with an empty allow-list") {
    Capture capture;
    zeromq::ServerOptions options;
    options.bind = "tcp://127.0.0.1:0";
    options.key = generate_keypair();
    options.link = ZmqBackend::test_link(capture);
    CHECK_THROWS_WITH_AS(zeromq::Server{options}, doctest::Contains("allow-list is empty"),
                         KeyError);
  }

  TEST_CASE("a bad endpoint is a TransportError") {
    Head head;
    zeromq::ServerOptions options;
    options.bind = head.server->endpoint();  // in use
    options.key = head.key;
    options.allow.add("alice", head.alice.public_key);
    options.link = ZmqBackend::test_link(head.capture);
    CHECK_THROWS_AS(zeromq::Server{options}, TransportError);
    options.bind = "tcp://not an address";
    CHECK_THROWS_AS(zeromq::Server{options}, TransportError);
  }
}

}  // namespace xloco::net::test
