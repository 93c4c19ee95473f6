// One set of transport tests, run over both backends (ZeroMQ with CURVE on 127.0.0.1, and
// in-process): what the outer loop relies on must not depend on the backend.
#include <doctest/doctest.h>

#include <set>

#include "cases.h"
#include "helpers.h"

namespace xloco::net::test {
namespace {

// Sends and returns what the other end received (REQUIREs that it arrived). A transport moves
// its queues while its owner calls it, so the sender is polled while the receiver waits.
Received relay(Transport& from, const PeerId& to, Transport& at, const Message& message) {
  REQUIRE(from.send(to, message) == SendStatus::kSent);
  std::optional<Received> got;
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  while (!got && std::chrono::steady_clock::now() < deadline) {
    (void)from.poll(1ms);
    got = at.receive(10ms);
  }
  REQUIRE(got.has_value());
  return std::move(*got);
}

}  // namespace

TEST_SUITE("net.transport") {
  TEST_CASE_TEMPLATE("every message type crosses intact both ways", B, ZmqBackend,
                     InprocBackend) {
    B backend;
    auto alice = backend.provider("alice");
    for (const Envelope& envelope : sample_envelopes()) {
      CAPTURE(to_string(envelope.type()));
      const Received up = relay(*alice, kHeadPeer, backend.head(), encode(envelope));
      CHECK(up.peer == "alice");
      check_same(envelope, decode(up.message, kRun));
      const Received down = relay(backend.head(), "alice", *alice, encode(envelope));
      CHECK(down.peer == kHeadPeer);
      check_same(envelope, decode(down.message, kRun));
    }
  }

  TEST_CASE_TEMPLATE("a 64 MiB message crosses intact both ways", B, ZmqBackend, InprocBackend) {
    B backend;
    auto alice = backend.provider("alice");
    const Frame big(pattern(std::size_t{64} << 20, 1));
    const Received up =
        relay(*alice, kHeadPeer, backend.head(), encode({kRun, 1, Contribution{77, 0.0, big}}));
    const Envelope contribution = decode(up.message, kRun);
    const Frame& got = std::get<Contribution>(contribution.body).payload;
    REQUIRE(got.size() == big.size());
    CHECK(got == big);

    // Send back what arrived, so the downlink carries the received bytes, not the original.
    const Received down = relay(backend.head(), "alice", *alice, encode({kRun, 1, Update{got}}));
    const Envelope update = decode(down.message, kRun);
    CHECK(std::get<Update>(update.body).payload == big);
  }

  TEST_CASE_TEMPLATE("each malformed header gets its own error kind", B, ZmqBackend,
                     InprocBackend) {
    B backend;
    auto alice = backend.provider("alice");
    std::set<ProtocolErrorKind> kinds;
    for (const MalformedCase& bad : malformed_cases()) {
      CAPTURE(bad.name);
      const Received got = relay(*alice, kHeadPeer, backend.head(), bad.message);
      const auto kind = decode_error_kind(got.message);
      REQUIRE(kind.has_value());
      CHECK(*kind == bad.kind);
      kinds.insert(*kind);
    }
    CHECK(kinds.size() == kAllErrorKinds);
    // A bad message is the sender's problem, not the link's: the next good one still works.
    const Received fine =
        relay(*alice, kHeadPeer, backend.head(), encode({kRun, 3, Heartbeat{}}));
    CHECK(decode(fine.message, kRun).type() == MessageType::kHeartbeat);
  }

  TEST_CASE_TEMPLATE("providers are told apart and answered separately", B, ZmqBackend,
                     InprocBackend) {
    B backend;
    auto alice = backend.provider("alice");
    auto bob = backend.provider("bob");
    REQUIRE(alice->send(kHeadPeer, encode({kRun, 0, Hello{"alice", "c", 0, ""}})) == SendStatus::kSent);
    REQUIRE(bob->send(kHeadPeer, encode({kRun, 0, Hello{"bob", "c", 0, ""}})) == SendStatus::kSent);
    std::set<PeerId> seen;
    for (int i = 0; i < 2; ++i) {
      auto got = backend.head().receive(kPatience);
      REQUIRE(got.has_value());
      CHECK(std::get<Hello>(decode(got->message, kRun).body).provider == got->peer);
      seen.insert(got->peer);
    }
    CHECK(seen == std::set<PeerId>{"alice", "bob"});
    for (const PeerId& peer : seen) {
      REQUIRE(backend.head().send(peer, encode({kRun, 1, Bye{peer}})) == SendStatus::kSent);
    }
    for (auto* provider : {alice.get(), bob.get()}) {
      auto got = provider->receive(kPatience);
      REQUIRE(got.has_value());
      const std::string name = provider == alice.get() ? "alice" : "bob";
      CHECK(std::get<Bye>(decode(got->message, kRun).body).reason == name);
    }
  }

  TEST_CASE_TEMPLATE("expected non-events are values, not exceptions", B, ZmqBackend,
                     InprocBackend) {
    B backend;
    auto alice = backend.provider("alice");
    CHECK(backend.head().send("nobody", encode({kRun, 0, Heartbeat{}})) == SendStatus::kNoPeer);
    CHECK_FALSE(backend.head().receive(0ms).has_value());
    CHECK_FALSE(backend.head().poll(10ms));
    CHECK_FALSE(alice->receive(10ms).has_value());
    REQUIRE(alice->send(kHeadPeer, encode({kRun, 0, Heartbeat{}})) == SendStatus::kSent);
    CHECK(backend.head().poll(kPatience));
    CHECK(backend.head().receive(0ms).has_value());  // poll promised a message
    CHECK_THROWS_AS((void)alice->send("bob", encode({kRun, 0, Heartbeat{}})), NetError);
    CHECK_THROWS_AS((void)alice->send(kHeadPeer, Message{}), NetError);
  }

  TEST_CASE_TEMPLATE("frames are shared, so a broadcast costs no copies", B, ZmqBackend,
                     InprocBackend) {
    B backend;
    std::vector<std::unique_ptr<Transport>> providers;
    for (const char* name : {"alice", "bob", "carol"}) {
      providers.push_back(backend.provider(name));
      REQUIRE(providers.back()->send(kHeadPeer, encode({kRun, 0, Hello{name, "c", 0, ""}})) ==
              SendStatus::kSent);
      REQUIRE(backend.head().receive(kPatience).has_value());
    }
    const Message update = encode({kRun, 1, Update{Frame(pattern(1 << 20, 9))}});
    for (const char* name : {"alice", "bob", "carol"}) {
      REQUIRE(backend.head().send(name, update) == SendStatus::kSent);
    }
    for (auto& provider : providers) {
      auto got = provider->receive(kPatience);
      REQUIRE(got.has_value());
      CHECK(std::get<Update>(decode(got->message, kRun).body).payload == update[1]);
    }
  }
}

}  // namespace xloco::net::test
