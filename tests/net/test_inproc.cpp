// Fault injection in the in-process backend: drops, delays, cuts, and torchft-style
// fail_at(provider, round), plus the queue and naming rules the ZeroMQ backend also keeps.
#include <doctest/doctest.h>

#include <atomic>
#include <exception>
#include <vector>
#include <thread>

#include "cases.h"
#include "helpers.h"

namespace xloco::net::test {
namespace {

Message round_message(std::uint64_t round) { return encode({kRun, round, Heartbeat{}}); }

std::uint64_t round_of(const Received& received) { return decode(received.message, kRun).round; }

struct World {
  std::shared_ptr<inproc::Network> network = inproc::Network::create();
  std::unique_ptr<Transport> head = network->listen();
  std::unique_ptr<Transport> alice = network->connect("alice");
  std::unique_ptr<Transport> bob = network->connect("bob");
  inproc::Faults& faults = network->faults();
};

}  // namespace

TEST_SUITE("net.inproc") {
  TEST_CASE("drop_next loses exactly that many messages, in the direction asked") {
    World w;
    w.faults.drop_next("alice", 2, inproc::Direction::kFromPeer);
    for (std::uint64_t round = 1; round <= 3; ++round) {
      REQUIRE(w.alice->send(kHeadPeer, round_message(round)) == SendStatus::kSent);
    }
    auto got = w.head->receive(kPatience);
    REQUIRE(got.has_value());
    CHECK(round_of(*got) == 3);
    CHECK(w.faults.lost() == 2);
    REQUIRE(w.head->send("alice", round_message(4)) == SendStatus::kSent);  // other direction
    CHECK(w.alice->receive(kPatience).has_value());
  }

  TEST_CASE("duplicate_next delivers exactly that many messages twice, in the direction asked") {
    World w;
    w.faults.duplicate_next("alice", 1, inproc::Direction::kFromPeer);
    REQUIRE(w.alice->send(kHeadPeer, round_message(1)) == SendStatus::kSent);
    REQUIRE(w.alice->send(kHeadPeer, round_message(2)) == SendStatus::kSent);
    std::vector<std::uint64_t> rounds;
    while (auto got = w.head->receive(std::chrono::milliseconds(50))) rounds.push_back(round_of(*got));
    CHECK(rounds == std::vector<std::uint64_t>{1, 1, 2});
    REQUIRE(w.head->send("alice", round_message(3)) == SendStatus::kSent);  // other direction: once
    CHECK(w.alice->receive(kPatience).has_value());
    CHECK(!w.alice->receive(std::chrono::milliseconds(50)).has_value());
  }

  TEST_CASE("delay holds messages back, in order") {
    World w;
    w.faults.delay("alice", 150ms, inproc::Direction::kFromPeer);
    const auto sent_at = std::chrono::steady_clock::now();
    REQUIRE(w.alice->send(kHeadPeer, round_message(1)) == SendStatus::kSent);
    REQUIRE(w.alice->send(kHeadPeer, round_message(2)) == SendStatus::kSent);
    REQUIRE(w.bob->send(kHeadPeer, round_message(7)) == SendStatus::kSent);
    auto first = w.head->receive(kPatience);  // bob's, not delayed, overtakes
    REQUIRE(first.has_value());
    CHECK(first->peer == "bob");
    auto late = w.head->receive(kPatience);
    REQUIRE(late.has_value());
    CHECK(std::chrono::steady_clock::now() - sent_at >= 150ms);
    CHECK(round_of(*late) == 1);
    auto later = w.head->receive(kPatience);
    REQUIRE(later.has_value());
    CHECK(round_of(*later) == 2);
  }

  TEST_CASE("fail_at(provider, round) kills the provider at that round only") {
    World w;
    w.faults.fail_at("alice", 3);
    for (std::uint64_t round = 1; round <= 2; ++round) {
      REQUIRE(w.alice->send(kHeadPeer, round_message(round)) == SendStatus::kSent);
      auto got = w.head->receive(kPatience);
      REQUIRE(got.has_value());
      CHECK(round_of(*got) == round);
      REQUIRE(w.head->send("alice", round_message(round)) == SendStatus::kSent);
      REQUIRE(w.alice->receive(kPatience).has_value());
    }
    // The head opens round 3: alice dies on it; the message is lost, later sends see no peer.
    CHECK(w.head->send("alice", round_message(3)) == SendStatus::kSent);
    CHECK(w.faults.is_cut("alice"));
    CHECK_FALSE(w.alice->receive(kQuiet).has_value());
    CHECK(w.head->send("alice", round_message(3)) == SendStatus::kNoPeer);
    REQUIRE(w.alice->send(kHeadPeer, round_message(3)) == SendStatus::kSent);  // into the void
    // Bob lives on.
    REQUIRE(w.bob->send(kHeadPeer, round_message(3)) == SendStatus::kSent);
    auto got = w.head->receive(kPatience);
    REQUIRE(got.has_value());
    CHECK(got->peer == "bob");
    CHECK_FALSE(w.head->receive(kQuiet).has_value());

    w.faults.heal("alice");
    REQUIRE(w.alice->send(kHeadPeer, round_message(4)) == SendStatus::kSent);
    auto back = w.head->receive(kPatience);
    REQUIRE(back.has_value());
    CHECK(back->peer == "alice");
  }

  TEST_CASE("fail_at_message cuts a provider at its n-th message") {
    World w;
    w.faults.fail_at_message("bob", 2);
    for (std::uint64_t i = 0; i < 4; ++i) {
      REQUIRE(w.bob->send(kHeadPeer, round_message(i)) == SendStatus::kSent);
    }
    for (std::uint64_t i = 0; i < 2; ++i) {
      auto got = w.head->receive(kPatience);
      REQUIRE(got.has_value());
      CHECK(round_of(*got) == i);
    }
    CHECK_FALSE(w.head->receive(kQuiet).has_value());
    CHECK(w.faults.lost() == 2);
    CHECK(w.head->send("bob", round_message(5)) == SendStatus::kNoPeer);
  }

  TEST_CASE("cut drops what was waiting for the provider") {
    World w;
    REQUIRE(w.head->send("alice", round_message(1)) == SendStatus::kSent);
    w.faults.cut("alice");
    CHECK_FALSE(w.alice->receive(kQuiet).has_value());
    w.faults.heal("alice");
    CHECK_FALSE(w.alice->receive(10ms).has_value());  // lost, not postponed
  }

  TEST_CASE("a full mailbox never makes send wait: messages queue in the sender's outbox, in order, within its budget") {
    auto network = inproc::Network::create({/*queue_capacity=*/2});
    auto head = network->listen();
    auto alice = network->connect("alice");
    head->set_limits({-1, 1000});
    const auto t0 = std::chrono::steady_clock::now();
    for (std::uint64_t r = 1; r <= 4; ++r) CHECK(head->send("alice", round_message(r)) == SendStatus::kSent);
    CHECK(std::chrono::steady_clock::now() - t0 < 100ms);
    const LinkState queued = head->link_state("alice");
    CHECK(queued.queued_messages == 2);  // two in the mailbox, two waiting
    CHECK(head->send("alice", encode({kRun, 5, Update{Frame(pattern(2000, 1))}})) == SendStatus::kFull);
    CHECK(head->send("alice", round_message(9), {/*urgent=*/true}) == SendStatus::kSent);
    std::vector<std::uint64_t> rounds;
    while (rounds.size() < 5) {
      (void)head->poll(1ms);  // the sender's calls move its outbox on
      if (auto got = alice->receive(10ms)) rounds.push_back(round_of(*got));
    }
    // the urgent one passed those still in the outbox, not those already delivered
    CHECK(rounds == std::vector<std::uint64_t>{1, 2, 9, 3, 4});
    const LinkState done = head->link_state("alice");
    CHECK(done.queued_bytes == 0);
    CHECK(done.enqueued_bytes > 0);
    CHECK(done.taken_bytes == done.enqueued_bytes);  // the refused one was never enqueued
    head->drop_queue("alice");
    CHECK(head->link_state("alice").enqueued_bytes == 0);
  }

  TEST_CASE("names are unique and a closed end is an absent peer") {
    World w;
    CHECK_THROWS_AS(w.network->listen(), NetError);
    CHECK_THROWS_AS(w.network->connect("alice"), NetError);
    CHECK_THROWS_AS(w.network->connect(kHeadPeer), NetError);
    w.alice.reset();
    CHECK(w.head->send("alice", round_message(1)) == SendStatus::kNoPeer);
    auto again = w.network->connect("alice");  // a restarted provider
    REQUIRE(again->send(kHeadPeer, round_message(2)) == SendStatus::kSent);
    CHECK(w.head->receive(kPatience).has_value());
    w.head.reset();
    CHECK(again->send(kHeadPeer, round_message(3)) == SendStatus::kNoPeer);
    auto head = w.network->listen();  // a restarted head
    CHECK(again->send(kHeadPeer, round_message(4)) == SendStatus::kSent);
  }

  TEST_CASE("providers on threads exchange rounds with the head while one of them dies") {
    constexpr int kProviders = 4;
    constexpr std::uint64_t kRounds = 20;
    constexpr std::uint64_t kDeathRound = 10;  // p2 dies sending this round
    auto network = inproc::Network::create();
    auto head = network->listen();
    network->faults().fail_at("p2", kDeathRound);
    std::vector<std::unique_ptr<Transport>> ends;
    for (int p = 0; p < kProviders; ++p) ends.push_back(network->connect("p" + std::to_string(p)));

    std::exception_ptr failure;
    std::mutex failure_mutex;
    std::vector<std::thread> threads;
    for (int p = 0; p < kProviders; ++p) {
      threads.emplace_back([&, p] {
        try {
          const PeerId name = "p" + std::to_string(p);
          for (std::uint64_t round = 1; round <= kRounds; ++round) {
            REQUIRE(ends[p]->send(kHeadPeer, round_message(round)) == SendStatus::kSent);
            const auto deadline = std::chrono::steady_clock::now() + kPatience;
            while (!ends[p]->receive(20ms)) {
              if (network->faults().is_cut(name)) return;  // dead: nothing more will come
              REQUIRE(std::chrono::steady_clock::now() < deadline);
            }
          }
        } catch (...) {
          std::lock_guard<std::mutex> lock(failure_mutex);
          if (!failure) failure = std::current_exception();
        }
      });
    }
    std::map<PeerId, std::uint64_t> last_round;
    const std::uint64_t expected = (kProviders - 1) * kRounds + (kDeathRound - 1);
    for (std::uint64_t n = 0; n < expected; ++n) {
      auto got = head->receive(kPatience);
      if (!got) break;
      last_round[got->peer] = round_of(*got);
      REQUIRE(head->send(got->peer, round_message(round_of(*got))) == SendStatus::kSent);
    }
    for (auto& thread : threads) thread.join();
    if (failure) std::rethrow_exception(failure);
    CHECK_FALSE(head->receive(10ms).has_value());
    CHECK(last_round["p0"] == kRounds);
    CHECK(last_round["p1"] == kRounds);
    CHECK(last_round["p3"] == kRounds);
    CHECK(last_round["p2"] == kDeathRound - 1);
  }
}

}  // namespace xloco::net::test
