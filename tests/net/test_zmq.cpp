// What only the ZeroMQ backend can show: CURVE and the ZAP allow-list keep strangers out,
// ZMQ_MAXMSGSIZE protects the head, and a provider survives a head restart. All on 127.0.0.1
// with ports picked by the OS.
#include <doctest/doctest.h>

#include <thread>

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
    options.limits.max_frame_bytes = max_frame_bytes;
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

    // Exactly at the limit passes: the limit is on the frame, not on its wire form. (A
    // transport moves its queue while its owner calls it: alice is polled while the head waits.)
    const auto receive_pumping = [&](Transport& sender) {
      std::optional<Received> got;
      const auto deadline = std::chrono::steady_clock::now() + kPatience;
      while (!got && std::chrono::steady_clock::now() < deadline) {
        (void)sender.poll(1ms);
        got = head.server->receive(10ms);
      }
      return got;
    };
    const Frame at_limit(pattern(kLimit, 3));
    REQUIRE(alice.send(kHeadPeer, encode({kRun, 1, Update{at_limit}})) == SendStatus::kSent);
    auto first = receive_pumping(alice);
    REQUIRE(first.has_value());
    CHECK(std::get<Update>(decode(first->message, kRun).body).payload == at_limit);

    REQUIRE(alice.send(kHeadPeer, encode({kRun, 2, Update{Frame(pattern(kLimit + 1, 4))}})) ==
            SendStatus::kSent);
    REQUIRE(bob.send(kHeadPeer, heartbeat(2)) == SendStatus::kSent);
    auto got = receive_pumping(alice);
    REQUIRE(got.has_value());
    CHECK(got->peer == "bob");
    // Alice stays connected: her next message is the next thing the head gets from her, and
    // as a connection keeps order, her oversize frame was dropped (and logged) before it.
    REQUIRE(alice.send(kHeadPeer, heartbeat(3)) == SendStatus::kSent);
    auto next = receive_pumping(alice);
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

  TEST_CASE("a malformed header is dropped and logged, and the sender stays connected") {
    Head head;
    ::zmq::context_t context;
    ::zmq::socket_t raw = head.raw_dealer(context, head.alice);
    const std::uint8_t old_format[] = {1, 0, 0, 0x10, 0, 0, 0, 0, 0};
    REQUIRE(raw.send(::zmq::buffer(old_format), ::zmq::send_flags::none));
    const std::uint8_t lying[] = {2, 0, 0, 0x10, 0, 0, 0, 0, 0, 0};  // WHOLE, 1 MiB, no parts
    REQUIRE(raw.send(::zmq::buffer(lying), ::zmq::send_flags::none));
    const std::uint8_t orphan_chunk[] = {2, 2, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    REQUIRE(raw.send(::zmq::buffer(orphan_chunk), ::zmq::send_flags::sndmore));
    REQUIRE(raw.send(::zmq::str_buffer("garbage"), ::zmq::send_flags::none));
    const std::uint8_t good[] = {2, 0, 4, 0, 0, 0, 0, 0, 0, 0};
    REQUIRE(raw.send(::zmq::buffer(good), ::zmq::send_flags::sndmore));
    REQUIRE(raw.send(::zmq::str_buffer("ping"), ::zmq::send_flags::none));
    auto got = head.server->receive(kPatience);
    REQUIRE(got.has_value());
    CHECK(got->peer == "alice");
    REQUIRE(got->message.size() == 1);
    CHECK(got->message[0].view() == "ping");
    CHECK(head.capture.sink->count("dropped a message from alice: wire format version 1, this "
                                   "end speaks 2") == 1);
    CHECK(head.capture.sink->count("dropped a message from alice: malformed header part (10 "
                                   "bytes, 0 parts)") == 1);
    CHECK(head.capture.sink->count("dropped a message from alice: chunk of stream 9 with no "
                                   "stream started") == 1);
  }

  TEST_CASE("a stream over max_frame_bytes is refused at its start: its chunks are never stored") {
    constexpr std::int64_t kLimit = 4 << 20;
    constexpr std::size_t kChunks = 256;  // a 256 MiB frame
    Head head(kLimit);
    zeromq::Client bob(head.client(head.bob));
    ::zmq::context_t context;
    ::zmq::socket_t raw = head.raw_dealer(context, head.alice);
    raw.set(::zmq::sockopt::sndhwm, 16);
    // One chunk-sized buffer, sent without copies, over and over: the sender holds 1 MiB.
    static const std::vector<std::uint8_t> chunk = pattern(zeromq::kChunkBytes, 6);
    const auto put = [](std::uint8_t* at, std::uint64_t v) {
      for (int b = 0; b < 8; ++b) at[b] = static_cast<std::uint8_t>(v >> (8 * b));
    };
    std::uint8_t start[18] = {2, 1};
    put(start + 2, 77);
    put(start + 10, kChunks * zeromq::kChunkBytes);
    const std::int64_t before = test::resident_bytes();
    test::reset_peak_resident();
    REQUIRE(raw.send(::zmq::buffer(start), ::zmq::send_flags::none));
    std::thread sender([&] {
      for (std::size_t i = 0; i < kChunks; ++i) {
        std::uint8_t header[18] = {2, 2};
        put(header + 2, 77);
        put(header + 10, i * zeromq::kChunkBytes);
        raw.send(::zmq::buffer(header), ::zmq::send_flags::sndmore);
        ::zmq::message_t data(const_cast<std::uint8_t*>(chunk.data()), chunk.size(), nullptr, nullptr);
        raw.send(data, ::zmq::send_flags::none);
      }
      const std::uint8_t good[] = {2, 0, 4, 0, 0, 0, 0, 0, 0, 0};
      raw.send(::zmq::buffer(good), ::zmq::send_flags::sndmore);
      raw.send(::zmq::str_buffer("done"), ::zmq::send_flags::none);
    });
    std::optional<Received> got;
    const auto deadline = std::chrono::steady_clock::now() + kPatience;
    while (std::chrono::steady_clock::now() < deadline) {
      got = head.server->receive(200ms);
      if (got && got->peer == "alice") break;
    }
    sender.join();
    const std::int64_t grew = test::peak_resident_bytes() - before;
    REQUIRE(got.has_value());
    CHECK(got->message[0].view() == "done");  // alice is still connected and heard
    CHECK(head.capture.sink->count("a frame of 268435456 bytes is over max_frame_bytes (4194304)") == 1);
    CHECK(head.capture.sink->count("dropped a message from alice") == 1);  // the START, once
    MESSAGE("peak RSS grew by " << grew / (1 << 20) << " MiB while a 256 MiB stream was refused");
    CHECK(grew < (64 << 20));  // buffering it would take 256 MiB; the queues hold ~2 × 16 MiB
    // bob was never held up
    REQUIRE(bob.send(kHeadPeer, heartbeat(5)) == SendStatus::kSent);
    got = head.server->receive(kPatience);
    REQUIRE(got.has_value());
    CHECK(got->peer == "bob");
  }

  TEST_CASE("a stream whose frames are each under the limit but whose total is not, or of too many frames, is refused at its start") {
    Head head(4 << 20);
    ::zmq::context_t context;
    ::zmq::socket_t raw = head.raw_dealer(context, head.alice);
    const auto put = [](std::uint8_t* at, std::uint64_t v) {
      for (int b = 0; b < 8; ++b) at[b] = static_cast<std::uint8_t>(v >> (8 * b));
    };
    std::uint8_t three[2 + 8 + 3 * 8] = {2, 1};
    put(three + 2, 5);
    for (int i = 0; i < 3; ++i) put(three + 10 + 8 * i, 3 << 20);  // 9 MiB in all
    REQUIRE(raw.send(::zmq::buffer(three), ::zmq::send_flags::none));
    std::vector<std::uint8_t> many(2 + 8 + 4099 * 8, 0);  // an UPDATE carries up to 4096 + 2
    many[0] = 2;
    many[1] = 1;
    put(many.data() + 2, 6);
    for (int i = 0; i < 4099; ++i) put(many.data() + 10 + 8 * i, 16);
    REQUIRE(raw.send(::zmq::buffer(many), ::zmq::send_flags::none));
    const std::uint8_t good[] = {2, 0, 4, 0, 0, 0, 0, 0, 0, 0};
    REQUIRE(raw.send(::zmq::buffer(good), ::zmq::send_flags::sndmore));
    REQUIRE(raw.send(::zmq::str_buffer("ping"), ::zmq::send_flags::none));
    auto got = head.server->receive(kPatience);
    REQUIRE(got.has_value());
    CHECK(got->message[0].view() == "ping");
    CHECK(head.capture.sink->count("a stream of 9437184 bytes is over max_frame_bytes (4194304)") == 1);
    CHECK(head.capture.sink->count("a stream of 4099 frames; this end takes at most 4098") == 1);
    // An end that takes at most 2 frames a message (the head: a CONTRIBUTION is the longest it
    // receives) refuses 3 at the stream's start, and in one whole message, before storing them.
    head.server->set_limits({4 << 20, -1, 2});
    std::uint8_t small3[2 + 8 + 3 * 8] = {2, 1};
    put(small3 + 2, 7);
    for (int i = 0; i < 3; ++i) put(small3 + 10 + 8 * i, 1);
    REQUIRE(raw.send(::zmq::buffer(small3), ::zmq::send_flags::none));
    const std::uint8_t whole3[] = {2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
                                   1, 0, 0, 0, 0, 0, 0, 0};
    REQUIRE(raw.send(::zmq::buffer(whole3), ::zmq::send_flags::sndmore));
    REQUIRE(raw.send(::zmq::str_buffer("a"), ::zmq::send_flags::sndmore));
    REQUIRE(raw.send(::zmq::str_buffer("b"), ::zmq::send_flags::sndmore));
    REQUIRE(raw.send(::zmq::str_buffer("c"), ::zmq::send_flags::none));
    REQUIRE(raw.send(::zmq::buffer(good), ::zmq::send_flags::sndmore));
    REQUIRE(raw.send(::zmq::str_buffer("pong"), ::zmq::send_flags::none));
    got = head.server->receive(kPatience);
    REQUIRE(got.has_value());
    CHECK(got->message[0].view() == "pong");
    CHECK(head.capture.sink->count("a stream of 3 frames; this end takes at most 2") == 1);
    CHECK(head.capture.sink->count("a message of 3 frames; this end takes at most 2") == 1);
  }

  TEST_CASE("send never waits: a peer that does not read fills only its own queue, which stalls and then refuses") {
    Head head;
    head.server->set_limits({std::int64_t{1} << 30, 48 << 20});  // a 48 MiB budget per peer
    zeromq::Client bob(head.client(head.bob));
    ::zmq::context_t context;
    ::zmq::socket_t raw = head.raw_dealer(context, head.alice);  // never reads
    raw.set(::zmq::sockopt::rcvhwm, 1);
    const std::uint8_t hello[] = {2, 0, 2, 0, 0, 0, 0, 0, 0, 0};
    REQUIRE(raw.send(::zmq::buffer(hello), ::zmq::send_flags::sndmore));
    REQUIRE(raw.send(::zmq::str_buffer("hi"), ::zmq::send_flags::none));
    REQUIRE(head.server->receive(kPatience).has_value());  // the head knows alice now
    REQUIRE(bob.send(kHeadPeer, heartbeat()) == SendStatus::kSent);
    REQUIRE(head.server->receive(kPatience).has_value());

    const Frame big(pattern(std::size_t{32} << 20, 7));
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(head.server->send("alice", encode({kRun, 1, Update{big}})) == SendStatus::kSent);
    CHECK(head.server->send("alice", encode({kRun, 2, Update{big}})) == SendStatus::kFull);
    CHECK(std::chrono::steady_clock::now() - t0 < 1s);  // queued, not waited on
    CHECK(head.server->send("bob", encode({kRun, 1, Update{big}})) == SendStatus::kSent);
    std::optional<Received> at_bob;
    const auto deadline = std::chrono::steady_clock::now() + kPatience;
    while (!at_bob && std::chrono::steady_clock::now() < deadline) {
      (void)head.server->receive(10ms);  // the head's loop moves the queues
      at_bob = bob.receive(10ms);
    }
    REQUIRE(at_bob.has_value());
    CHECK(std::get<Update>(decode(at_bob->message, kRun).body).payload == big);
    // alice's queue took what its socket and TCP buffers hold, then stopped moving.
    const auto settle = std::chrono::steady_clock::now() + 600ms;
    while (std::chrono::steady_clock::now() < settle) (void)head.server->receive(10ms);
    const LinkState alice = head.server->link_state("alice");
    CHECK(alice.queued_bytes > 0);
    CHECK(alice.queued_bytes < big.size());
    CHECK(std::chrono::steady_clock::now() - alice.last_progress > 300ms);
    CHECK(head.server->link_state("bob").queued_bytes == 0);
    head.server->drop_queue("alice");
    CHECK(head.server->link_state("alice").queued_bytes == 0);
  }

  TEST_CASE("an urgent message passes a long transfer to the same peer") {
    Head head;
    zeromq::Client alice(head.client(head.alice));
    REQUIRE(alice.send(kHeadPeer, heartbeat()) == SendStatus::kSent);
    REQUIRE(head.server->receive(kPatience).has_value());
    const Frame big(pattern(std::size_t{128} << 20, 8));
    REQUIRE(head.server->send("alice", encode({kRun, 1, Update{big}})) == SendStatus::kSent);
    REQUIRE(head.server->send("alice", heartbeat(9), {/*urgent=*/true}) == SendStatus::kSent);
    std::vector<MessageType> order;
    const auto deadline = std::chrono::steady_clock::now() + kPatience;
    while (order.size() < 2 && std::chrono::steady_clock::now() < deadline) {
      (void)head.server->receive(5ms);
      if (auto got = alice.receive(5ms)) order.push_back(decode(got->message, kRun).type());
    }
    CHECK(order == std::vector<MessageType>{MessageType::kHeartbeat, MessageType::kUpdate});
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
      REQUIRE(alice.send(kHeadPeer, heartbeat(2)) != SendStatus::kNoPeer);
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
      status = head.server->send("alice", heartbeat());
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
