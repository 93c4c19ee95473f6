// The head's membership rules and its aggregation, and the provider leader's rules: pure
// functions with an injected clock, no sockets. One case per rule, each failing if its rule is
// taken out.
#include "doctest_torch.h"

#include <chrono>
#include <cstring>
#include <limits>

#include "common/json_text.h"
#include "common/log_limit.h"
#include "compress/encoder.h"
#include "compress/torch_adapter.h"
#include "outer/head/membership.h"
#include "outer/provider/attack.h"
#include "outer/provider/leader_rules.h"
#include "outer/round/aggregate.h"
#include "outer/round/outer_opt.h"
#include "outer/status/documents.h"

// Last: LibTorch may pull in glog, whose CHECK would shadow doctest's.

using namespace xloco;
using namespace xloco::outer;
using net::RefusalCode;

namespace {

Clock::time_point clock_at(double s) {
  return Clock::time_point{} + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

common::OuterConfig three_shards() {
  common::OuterConfig c;
  c.providers = 3;
  c.min_providers = 2;
  c.dead_after_s = 5;
  return c;
}

Member live(int shard, double seen_s, MemberState state = MemberState::kActive) {
  Member m;
  m.shard = shard;
  m.state = state;
  m.last_seen = clock_at(seen_s);
  return m;
}

net::Hello hello(const std::string& name, int64_t shard = -1, const std::string& hash = "") {
  return net::Hello{name, "cfg", 0, hash, shard};
}

RunPosition position() { return {"cfg", 7, "h7", "h6", true}; }

RoundState round_of(uint64_t r, std::set<std::string> active) {
  RoundState s;
  s.round = r;
  s.started = clock_at(100);
  s.active = std::move(active);
  return s;
}

}  // namespace

TEST_SUITE("membership") {
  TEST_CASE("admission: a config hash other than the run's is refused by code") {
    auto h = hello("p0");
    h.config_hash = "other";
    const auto a = admit(clock_at(200), "p0", h, {}, position(), net::LinkState{}, three_shards());
    CHECK(!a.admit);
    CHECK(a.code == RefusalCode::kConfigHash);
    CHECK(a.reason.find("other") != std::string::npos);
  }

  TEST_CASE("admission: a shard the run does not have is refused; a free asked-for shard is granted") {
    auto a = admit(clock_at(200), "p0", hello("p0", 3), {}, position(), net::LinkState{}, three_shards());
    CHECK(!a.admit);
    CHECK(a.code == RefusalCode::kBadShard);
    a = admit(clock_at(200), "p0", hello("p0", 2), {}, position(), net::LinkState{}, three_shards());
    REQUIRE(a.admit);
    CHECK(a.shard == 2);  // not the lowest free one: the one it asked for
  }

  TEST_CASE("admission: shards follow names, not arrival; a taken shard falls back to the lowest free one, saying whose it is") {
    const Members m = {{"p2", live(2, 0)}};
    auto a = admit(clock_at(200), "p0", hello("p0", 0), m, position(), net::LinkState{}, three_shards());
    CHECK(a.shard == 0);
    a = admit(clock_at(200), "p1", hello("p1", 2), m, position(), net::LinkState{}, three_shards());
    REQUIRE(a.admit);
    CHECK(a.shard == 0);
    CHECK(a.reason.find("shard 2 is p2's") != std::string::npos);
    a = admit(clock_at(200), "p1", hello("p1"), m, position(), net::LinkState{}, three_shards());  // any: the lowest free one
    CHECK(a.shard == 0);
  }

  TEST_CASE("admission: a rejoining provider keeps its shard, even one it did not ask for") {
    const Members m = {{"p0", live(1, 3)}};
    const auto a = admit(clock_at(200), "p0", hello("p0", 2), m, position(), net::LinkState{}, three_shards());
    REQUIRE(a.admit);
    CHECK(a.shard == 1);
    CHECK(!a.fresh);
    CHECK(a.reason.find("rejoined") != std::string::npos);
  }

  TEST_CASE("admission: every shard taken (dead members keep theirs) is kFull") {
    const Members m = {{"a", live(0, 0)}, {"b", live(1, 0, MemberState::kDead)}, {"c", live(2, 0)}};
    const auto a = admit(clock_at(200), "d", hello("d"), m, position(), net::LinkState{}, three_shards());
    CHECK(!a.admit);
    CHECK(a.code == RefusalCode::kFull);
  }

  TEST_CASE("admission: shared_data puts every provider on shard 0") {
    auto c = three_shards();
    c.shared_data = true;
    const Members m = {{"a", live(0, 0)}, {"b", live(0, 0)}, {"c", live(0, 0)}};
    const auto a = admit(clock_at(200), "d", hello("d"), m, position(), net::LinkState{}, c);
    REQUIRE(a.admit);
    CHECK(a.shard == 0);
  }

  TEST_CASE("admission: what it is sent follows the hash it holds; a member known only from a checkpoint is fresh") {
    Members m;
    m["p0"].shard = 0;  // restored from a checkpoint: never seen by this head process
    CHECK(admit(clock_at(200), "p0", hello("p0", 0, "h7"), m, position(), net::LinkState{}, three_shards()).sync == SyncAction::kNone);
    CHECK(admit(clock_at(200), "p0", hello("p0", 0, "h6"), m, position(), net::LinkState{}, three_shards()).sync == SyncAction::kUpdate);
    CHECK(admit(clock_at(200), "p0", hello("p0", 0, "h5"), m, position(), net::LinkState{}, three_shards()).sync == SyncAction::kFullState);
    CHECK(admit(clock_at(200), "p0", hello("p0", 0, ""), m, position(), net::LinkState{}, three_shards()).sync == SyncAction::kFullState);
    auto no_update = position();
    no_update.have_last_update = false;
    CHECK(admit(clock_at(200), "p0", hello("p0", 0, "h6"), m, no_update, net::LinkState{}, three_shards()).sync == SyncAction::kFullState);
    CHECK(admit(clock_at(200), "p0", hello("p0", 0, "h7"), m, position(), net::LinkState{}, three_shards()).fresh);
  }

  TEST_CASE("admission: a live member's repeated HELLO is ignored while its WELCOME is queued, or soon after its admission") {
    Members m = {{"p0", live(0, 100)}};
    m["p0"].admitted_at = clock_at(198);
    auto c = three_shards();
    c.hello_interval_s = 5;
    auto a = admit(clock_at(200), "p0", hello("p0", 0), m, position(), net::LinkState{}, c);
    CHECK(a.ignore);
    CHECK(!a.admit);
    CHECK(a.reason.find("2.0s after its admission") != std::string::npos);
    a = admit(clock_at(210), "p0", hello("p0", 0), m, position(), net::LinkState{}, c);
    CHECK(a.admit);  // 12 s later: a real rejoin
    net::LinkState welcome_on_its_way;
    welcome_on_its_way.queued_bytes = 4 << 20;
    a = admit(clock_at(260), "p0", hello("p0", 0), m, position(), welcome_on_its_way, c);
    CHECK(a.ignore);
    CHECK(a.reason.find("4194304 bytes of its WELCOME") != std::string::npos);
    m["p0"].state = MemberState::kDead;  // a dead member is judged afresh
    CHECK(admit(clock_at(199), "p0", hello("p0", 0), m, position(), welcome_on_its_way, c).admit);
  }

  TEST_CASE("admission: a live member asking for the full state again within kFullStateEveryRounds rounds is ignored as limited; later, or dead, it is sent") {
    Members m = {{"p0", live(0, 100)}};
    m["p0"].admitted_at = clock_at(100);
    m["p0"].full_state_round = 6;  // position(): the run is after round 7
    auto c = three_shards();
    c.hello_interval_s = 5;
    auto a = admit(clock_at(200), "p0", hello("p0", 0, ""), m, position(), net::LinkState{}, c);
    CHECK(a.ignore);
    CHECK(a.limited);
    CHECK(!a.admit);
    CHECK(a.reason.find("full state again at round 7, sent it after round 6") != std::string::npos);
    // One round behind, or current: no full state is asked for, so no limit.
    CHECK(admit(clock_at(200), "p0", hello("p0", 0, "h6"), m, position(), net::LinkState{}, c).admit);
    CHECK(admit(clock_at(200), "p0", hello("p0", 0, "h7"), m, position(), net::LinkState{}, c).admit);
    m["p0"].full_state_round = 5;  // two rounds on: sent again
    a = admit(clock_at(200), "p0", hello("p0", 0, ""), m, position(), net::LinkState{}, c);
    CHECK(a.admit);
    CHECK(a.sync == SyncAction::kFullState);
    m["p0"].full_state_round = 7;
    m["p0"].state = MemberState::kDead;  // back from the dead: judged afresh
    CHECK(admit(clock_at(200), "p0", hello("p0", 0, ""), m, position(), net::LinkState{}, c).admit);
  }

  TEST_CASE("admission: a member dead for not keeping up is not answered until its backoff ends") {
    Members m = {{"slow", live(0, 100, MemberState::kDead)}};
    m["slow"].backoff_until = clock_at(300);
    auto a = admit(clock_at(250), "slow", hello("slow", 0), m, position(), net::LinkState{}, three_shards());
    CHECK(a.ignore);
    CHECK(a.reason.find("ignored for 50s more") != std::string::npos);
    CHECK(admit(clock_at(301), "slow", hello("slow", 0), m, position(), net::LinkState{}, three_shards()).admit);
  }

  TEST_CASE("a joiner takes part in rounds once its link has taken its WELCOME, whatever came after; stragglers take part") {
    Member joiner = live(0, 0, MemberState::kJoining);
    joiner.welcome_mark = 500;  // enqueued bytes once its WELCOME was queued
    net::LinkState queued;
    queued.queued_bytes = 1 << 20;
    queued.enqueued_bytes = 500 + (1 << 20);
    queued.taken_bytes = 499;
    CHECK(!takes_part(joiner, queued));
    queued.taken_bytes = 500;  // the WELCOME has gone; an update queued after it has not
    CHECK(takes_part(joiner, queued));
    CHECK(takes_part(live(0, 0, MemberState::kActive), queued));  // an update in transfer
    CHECK(takes_part(live(0, 0, MemberState::kStraggling), net::LinkState{}));
    CHECK(!takes_part(live(0, 0, MemberState::kDead), net::LinkState{}));
    CHECK(!takes_part(live(0, 0, MemberState::kLeft), net::LinkState{}));
  }

  TEST_CASE("contribution: from a non-member or a dead member, refused with rejoin") {
    const Members m = {{"dead", live(0, 0, MemberState::kDead)}};
    const auto open = round_of(8, {"dead"});
    for (const char* who : {"stranger", "dead"}) {
      const auto v = judge_contribution(who, 8, 100, 1000, m, &open, 7, std::nullopt);
      CHECK(v.action == ContributionAction::kRefuse);
      CHECK(v.code == RefusalCode::kRejoin);
    }
  }

  TEST_CASE("contribution: a round that has not started, or round 0, is refused as future") {
    const Members m = {{"p0", live(0, 0)}};
    const auto open = round_of(8, {"p0"});
    CHECK(judge_contribution("p0", 9, 100, 1000, m, &open, 7, std::nullopt).code == RefusalCode::kFutureRound);
    CHECK(judge_contribution("p0", 0, 100, 1000, m, &open, 7, std::nullopt).code == RefusalCode::kFutureRound);
    // Between rounds the next one (done + 1) is not future: it is late for nothing, but not refused.
    CHECK(judge_contribution("p0", 9, 100, 1000, m, nullptr, 7, std::nullopt).code == RefusalCode::kFutureRound);
    CHECK(judge_contribution("p0", 8, 100, 1000, m, nullptr, 7, std::nullopt).action == ContributionAction::kDrop);
  }

  TEST_CASE("contribution: a closed round's, or a second one, is dropped and counted late") {
    const Members m = {{"p0", live(0, 0)}};
    auto open = round_of(8, {"p0"});
    auto v = judge_contribution("p0", 7, 100, 1000, m, &open, 7, std::nullopt);
    CHECK(v.action == ContributionAction::kDrop);
    CHECK(v.late);
    open.contributed["p0"] = 100;
    v = judge_contribution("p0", 8, 100, 1000, m, &open, 7, std::nullopt);
    CHECK(v.action == ContributionAction::kDrop);
    CHECK(v.late);
    CHECK(v.reason.find("duplicate") != std::string::npos);
  }

  TEST_CASE("contribution: from a provider that joined after the round started, dropped, not late") {
    const Members m = {{"p0", live(0, 0)}, {"new", live(1, 0, MemberState::kJoining)}};
    const auto open = round_of(8, {"p0"});
    const auto v = judge_contribution("new", 8, 100, 1000, m, &open, 7, std::nullopt);
    CHECK(v.action == ContributionAction::kDrop);
    CHECK(!v.late);
  }

  TEST_CASE("contribution: zero tokens, or a frame that does not fit the model, refused by code") {
    const Members m = {{"p0", live(0, 0)}};
    const auto open = round_of(8, {"p0"});
    CHECK(judge_contribution("p0", 8, 0, 1000, m, &open, 7, std::nullopt).code == RefusalCode::kBadTokens);
    const auto v = judge_contribution("p0", 8, 100, 1000, m, &open, 7, std::string("tensor 0 is x [3]"));
    CHECK(v.action == ContributionAction::kRefuse);
    CHECK(v.code == RefusalCode::kBadFrame);
    CHECK(v.reason.find("tensor 0 is x [3]") != std::string::npos);
    CHECK(judge_contribution("p0", 8, 100, 1000, m, &open, 7, std::nullopt).action == ContributionAction::kAccept);
  }

  TEST_CASE("frame_mismatch names the first tensor whose name or shape differs") {
    common::FlatLayout layout;
    layout.append("w", {4, 3});
    layout.append("b", {3});
    compress::FrameInfo f;
    f.tensors = {{"w", {4, 3}, 12, 0, 0, {}}, {"b", {3}, 3, 0, 0, {}}};
    CHECK(!frame_mismatch(f, layout));
    f.tensors[1].shape = {4};
    REQUIRE(frame_mismatch(f, layout));
    CHECK(frame_mismatch(f, layout)->find("tensor 1 is b [4], the model's is b [3]") != std::string::npos);
    f.tensors.pop_back();
    CHECK(frame_mismatch(f, layout)->find("carries 1 tensors, the model has 2") != std::string::npos);
  }

  TEST_CASE("liveness: live members silent past dead_after_s are dead; the dead and the left are not judged again") {
    const Members m = {{"quiet", live(0, 100)}, {"chatty", live(1, 104)},
                       {"gone", live(2, 0, MemberState::kDead)}, {"bye", live(3, 0, MemberState::kLeft)}};
    const auto t = sweep(clock_at(105.5), m, three_shards());
    REQUIRE(t.size() == 1);
    CHECK(t[0].name == "quiet");
    CHECK(t[0].to == MemberState::kDead);
    CHECK(t[0].reason.find("silent for 5.5s") != std::string::npos);
  }

  TEST_CASE("liveness: a live member whose link has taken nothing of its queue for dead_after_s is dead; the head's own deafness does not count") {
    const Members m = {{"slow", live(0, 200)}, {"stuck", live(1, 200)}, {"idle", live(2, 200)},
                       {"gone", live(3, 0, MemberState::kDead)}};
    std::map<std::string, net::LinkState> links;
    links["slow"] = {100, 1, clock_at(198)};   // moved 2 s ago
    links["stuck"] = {100, 1, clock_at(190)};  // nothing for 10 s
    links["idle"] = {0, 0, clock_at(0)};       // nothing queued: nothing to take
    links["gone"] = {100, 1, clock_at(0)};
    auto t = stalled(clock_at(200), clock_at(0), m, links, three_shards());
    REQUIRE(t.size() == 1);
    CHECK(t[0].name == "stuck");
    CHECK(t[0].to == MemberState::kDead);
    CHECK(t[0].backoff);
    CHECK(t[0].reason.find("took nothing for 10.0s with 100 bytes queued") != std::string::npos);
    t = stalled(clock_at(200), clock_at(197), m, links, three_shards());  // the head was deaf until 197
    CHECK(t.empty());
  }

  TEST_CASE("liveness: at a round's close the active members that did not contribute are straggling") {
    auto r = round_of(8, {"a", "b", "c"});
    r.contributed = {{"a", 1}, {"c", 1}};
    const auto t = stragglers(r, "deadline");
    REQUIRE(t.size() == 1);
    CHECK(t[0].name == "b");
    CHECK(t[0].to == MemberState::kStraggling);
    CHECK(t[0].reason == "missed round 8 (deadline)");
  }

  TEST_CASE("liveness: time the head could not listen is forgiven, never past now; short gaps are not") {
    CHECK(forgiven(clock_at(100), clock_at(110), std::chrono::milliseconds(500)) == clock_at(100));
    CHECK(forgiven(clock_at(100), clock_at(110), std::chrono::seconds(4)) == clock_at(104));
    CHECK(forgiven(clock_at(100), clock_at(110), std::chrono::seconds(30)) == clock_at(110));
  }

  TEST_CASE("aggregation order: by shard, then name, whatever the set's order") {
    const Members m = {{"zeta", live(0, 0)}, {"alpha", live(2, 0)}, {"mid", live(1, 0)}, {"beta", live(2, 0)}};
    const auto r = round_of(1, {"alpha", "beta", "mid", "zeta"});
    CHECK(aggregation_order(r, m) == std::vector<std::string>{"zeta", "mid", "alpha", "beta"});
  }
}

namespace {

// fp32 frames of one tensor whose sum depends on the order of addition.
net::Frame frame_of(const common::FlatLayout& layout, const std::vector<float>& values) {
  compress::CodecConfig cc;
  cc.codec = compress::Codec::kFp32;
  cc.error_feedback = false;
  compress::Encoder enc(cc);
  auto t = torch::tensor(values);
  std::vector<uint8_t> frame;
  compress::encode(enc, layout, t, frame);
  return net::Frame(std::move(frame));
}

std::vector<float> sum_in(Aggregator& agg, const std::vector<std::pair<std::string, net::Frame>>& arrivals) {
  agg.begin({"a", "b", "c"});
  for (const auto& [peer, f] : arrivals) CHECK(agg.add(peer, f, 100).empty());
  CHECK(agg.finish().empty());
  const auto& d = agg.delta();
  return std::vector<float>(d.data_ptr<float>(), d.data_ptr<float>() + d.numel());
}

}  // namespace

TEST_SUITE("membership") {
  TEST_CASE("aggregation: Δ has the same bits whatever order the contributions arrive in") {
    common::FlatLayout layout;
    layout.append("w", {2});
    // (1e8 + 1) + -1e8 = 0 but (-1e8 + 1e8) + 1 = 1 in fp32: the order of addition shows.
    const auto a = frame_of(layout, {1e8f, 0.1f});
    const auto b = frame_of(layout, {1.0f, 0.2f});
    const auto c = frame_of(layout, {-1e8f, 0.3f});
    Aggregator agg(layout);
    const auto abc = sum_in(agg, {{"a", a}, {"b", b}, {"c", c}});
    const auto cab = sum_in(agg, {{"c", c}, {"a", a}, {"b", b}});
    const auto bca = sum_in(agg, {{"b", b}, {"c", c}, {"a", a}});
    CHECK(std::memcmp(abc.data(), cab.data(), 8) == 0);
    CHECK(std::memcmp(abc.data(), bca.data(), 8) == 0);
    CHECK(abc[0] == doctest::Approx(0.0f));  // a + b + c in that order, divided by 3
  }

  TEST_CASE("aggregation: a frame waits, compressed, for those ahead of it; a skipped provider unblocks it") {
    common::FlatLayout layout;
    layout.append("w", {2});
    Aggregator agg(layout);
    agg.begin({"a", "b"});
    CHECK(agg.add("b", frame_of(layout, {2, 4}), 100).empty());
    CHECK(agg.added() == 0);
    CHECK(agg.held_bytes() > 0);
    CHECK(agg.skip("a").empty());  // a died: b's turn
    CHECK(agg.added() == 1);
    CHECK(agg.held_bytes() == 0);
    CHECK(agg.finish().empty());
    CHECK(agg.delta()[1].item<float>() == 4);
  }

  TEST_CASE("aggregation: weights are tokens relative to the first added; a bad frame is rejected and leaves Δ as it was") {
    common::FlatLayout layout;
    layout.append("w", {2});
    Aggregator agg(layout);
    agg.begin({"a", "b", "c"});
    CHECK(agg.add("a", frame_of(layout, {1, 1}), 100).empty());
    CHECK(agg.add("b", frame_of(layout, {4, 4}), 300).empty());  // weight 3
    auto junk = frame_of(layout, {0, 0}).to_vector();
    std::memset(junk.data() + junk.size() - 4, 0xff, 4);  // the payload's last value is a NaN now
    const auto rejected = agg.add("c", net::Frame(junk), 100);
    REQUIRE(rejected.size() == 1);
    CHECK(rejected[0].peer == "c");
    CHECK(agg.finish().empty());
    CHECK(agg.added() == 2);
    CHECK(agg.delta()[0].item<float>() == doctest::Approx((1 + 3 * 4) / 4.0));
  }
}

TEST_SUITE("membership") {
  TEST_CASE("leader: the next round runs, another one resyncs, nothing runs while resynchronising") {
    LeaderState s{7, false, 1, 3};
    CHECK(on_head_message(s, {"r", 8, net::RoundStart{}}).action == LeaderAction::kRunRound);
    CHECK(on_head_message(s, {"r", 9, net::RoundStart{}}).action == LeaderAction::kResync);
    s.rejoining = true;
    CHECK(on_head_message(s, {"r", 8, net::RoundStart{}}).action == LeaderAction::kIgnore);
  }

  TEST_CASE("leader: the update closing its round applies; a later one resyncs; an older one is ignored") {
    const LeaderState s{7, false, 1, 3};
    CHECK(on_head_message(s, {"r", 8, net::Update{}}).action == LeaderAction::kApplyUpdate);
    CHECK(on_head_message(s, {"r", 10, net::Update{}}).action == LeaderAction::kResync);
    CHECK(on_head_message(s, {"r", 7, net::Update{}}).action == LeaderAction::kIgnore);
  }

  TEST_CASE("leader: WELCOME on its shard is a rejoin, on another shard fatal; BYE stops") {
    const LeaderState s{7, true, 1, 3};
    CHECK(on_head_message(s, {"r", 7, net::Welcome{{}, 1, 3}}).action == LeaderAction::kRejoined);
    const auto moved = on_head_message(s, {"r", 7, net::Welcome{{}, 2, 3}});
    CHECK(moved.action == LeaderAction::kFatal);
    CHECK(moved.reason.find("shard 1/3 to 2/3") != std::string::npos);
    CHECK(on_head_message(s, {"r", 7, net::Bye{"done"}}).action == LeaderAction::kStop);
  }

  TEST_CASE("leader: rejoin refusals resync, or repeat the HELLO while resynchronising; config, shard and full refusals are fatal; others reported") {
    LeaderState s{7, false, 1, 3};
    CHECK(on_head_message(s, {"r", 7, net::ErrorReply{RefusalCode::kRejoin, "who?"}}).action == LeaderAction::kResync);
    for (const auto code : {RefusalCode::kConfigHash, RefusalCode::kFull, RefusalCode::kBadShard}) {
      CHECK(on_head_message(s, {"r", 7, net::ErrorReply{code, "no"}}).action == LeaderAction::kFatal);
    }
    CHECK(on_head_message(s, {"r", 7, net::ErrorReply{RefusalCode::kBadFrame, "bad"}}).action == LeaderAction::kReport);
    s.rejoining = true;
    CHECK(on_head_message(s, {"r", 7, net::ErrorReply{RefusalCode::kRejoin, "who?"}}).action == LeaderAction::kRepeatHello);
  }
}

// ------------------------------------------------------------------ hostile contributions

namespace {

net::Frame encoded(const common::FlatLayout& layout, const torch::Tensor& values,
                   compress::Codec codec, uint32_t block = 256, uint32_t topk = 0,
                   uint32_t topk_bits = 2) {
  compress::CodecConfig cc;
  cc.codec = codec;
  cc.block_size = block;
  cc.topk = topk;
  cc.topk_bits = topk_bits;
  cc.error_feedback = false;
  compress::Encoder enc(cc);
  std::vector<uint8_t> frame;
  compress::encode(enc, layout, values, frame);
  return net::Frame(std::move(frame));
}

// Adds each (provider, δ) as an int8 contribution of 100 tokens, in order, then finishes the
// round: every refusal on the way.
std::vector<Aggregator::Rejected> add_and_finish(
    Aggregator& agg, const common::FlatLayout& layout,
    const std::vector<std::pair<std::string, torch::Tensor>>& contributions) {
  std::vector<Aggregator::Rejected> rejected;
  for (const auto& [peer, delta] : contributions) {
    const auto r = agg.add(peer, encoded(layout, delta, compress::Codec::kInt8), 100);
    rejected.insert(rejected.end(), r.begin(), r.end());
  }
  const auto r = agg.finish();
  rejected.insert(rejected.end(), r.begin(), r.end());
  return rejected;
}

}  // namespace

TEST_SUITE("membership") {
  TEST_CASE("contribution: more tokens than the round's schedule allows is refused, naming both") {
    const Members m = {{"p0", live(0, 0)}};
    const auto open = round_of(8, {"p0"});
    const auto v = judge_contribution("p0", 8, UINT64_MAX, 6400, m, &open, 7, std::nullopt);
    CHECK(v.action == ContributionAction::kRefuse);
    CHECK(v.code == RefusalCode::kBadTokens);
    CHECK(v.reason.find("allows 6400") != std::string::npos);
    CHECK(judge_contribution("p0", 8, 6400, 6400, m, &open, 7, std::nullopt).action == ContributionAction::kAccept);
  }

  TEST_CASE("round_token_allowance: steps of the round × batch × sequence; the last round is short") {
    common::Config c;
    c.model.kind = common::ModelKind::kGpt;
    c.model.seq_len = 128;
    c.inner.batch_size = 8;
    c.inner.steps = 120;
    c.outer.inner_steps = 50;
    CHECK(round_token_allowance(c, 1) == 50u * 8 * 128);
    CHECK(round_token_allowance(c, 3) == 20u * 8 * 128);  // steps 100..119
    CHECK(round_token_allowance(c, 4) == 0u);
    c.model.kind = common::ModelKind::kTorchScript;  // a Python model on text: tokens too
    CHECK(round_token_allowance(c, 1) == 50u * 8 * 128);
    c.data.dataset = common::DatasetKind::kFmnist;  // images count one each, whatever the model
    CHECK(round_token_allowance(c, 1) == 50u * 8);
    c.model.kind = common::ModelKind::kCnn;
    CHECK(round_token_allowance(c, 1) == 50u * 8);
  }

  TEST_CASE("frame_problem: a codec or block size other than the run's is named; the run's passes") {
    common::FlatLayout layout;
    layout.append("w", {600});
    const auto values = torch::full({600}, 1e30f);
    common::OuterConfig run;  // int8, block 256
    const auto fp32 = frame_problem(encoded(layout, values, compress::Codec::kFp32), layout, run);
    REQUIRE(fp32);
    CHECK(fp32->find("codec is fp32, the run's outer.codec_up is int8") != std::string::npos);
    const auto block = frame_problem(encoded(layout, values * 1e-30, compress::Codec::kInt8, 64), layout, run);
    REQUIRE(block);
    CHECK(block->find("block size is 64") != std::string::npos);
    CHECK(!frame_problem(encoded(layout, values * 1e-30, compress::Codec::kInt8), layout, run));
    common::FlatLayout other;
    other.append("v", {600});
    CHECK(frame_problem(encoded(other, values * 1e-30, compress::Codec::kInt8), layout, run));

    // topk: the count and the value width must be the run's too.
    run.codec_up = common::CodecKind::kTopk;
    run.block_size = 256;
    run.topk = 8;
    const auto small = values * 1e-30;
    CHECK(!frame_problem(encoded(layout, small, compress::Codec::kTopk, 256, 8), layout, run));
    const auto count = frame_problem(encoded(layout, small, compress::Codec::kTopk, 256, 16), layout, run);
    REQUIRE(count);
    CHECK(count->find("16 values per block") != std::string::npos);
    const auto wide = frame_problem(encoded(layout, small, compress::Codec::kTopk, 256, 8, 4), layout, run);
    REQUIRE(wide);
    CHECK(wide->find("4-bit values, the run's outer.topk_bits is 2") != std::string::npos);
    run.topk_bits = 4;
    CHECK(!frame_problem(encoded(layout, small, compress::Codec::kTopk, 256, 8, 4), layout, run));
  }

  TEST_CASE("judge_norm: beyond bound × the lower median of one norm per provider is refused; zero norms do not count; without a quorum it waits, or is refused at the end; bound 0 is off") {
    CHECK(judge_norm(5, {1, 1, 100, 5}, 4, 10, false).action == NormAction::kAccept);  // median 1
    const auto v = judge_norm(11, {1, 1, 100, 11}, 4, 10, false);
    CHECK(v.action == NormAction::kRefuse);
    CHECK(v.reason.find("11× the median 1 of 4 providers'") != std::string::npos);
    // Even counts take the lower median: two high norms of four cannot raise the bar.
    CHECK(judge_norm(1e30, {1, 3, 1e30, 1e30}, 4, 10, false).action == NormAction::kRefuse);
    CHECK(judge_norm(29, {1, 3, 29}, 3, 10, false).action == NormAction::kAccept);   // median 3
    CHECK(judge_norm(31, {1, 3, 31}, 3, 10, false).action == NormAction::kRefuse);
    // Zero frames say nothing: a coalition of zeros cannot make the median 0 (which accepted
    // anything), nor make a quorum.
    CHECK(judge_norm(1e30, {0, 0, 1e30, 1}, 4, 10, false).action == NormAction::kWait);
    const auto no_quorum = judge_norm(1e30, {0, 0, 1e30, 1}, 4, 10, true);
    CHECK(no_quorum.action == NormAction::kRefuse);
    CHECK(no_quorum.reason.find("no quorum to judge it: 2 providers' norms, 3 needed") != std::string::npos);
    CHECK(judge_norm(1e30, {0, 1e30, 1, 1}, 4, 10, false).action == NormAction::kRefuse);
    CHECK(judge_norm(0, {0, 1, 1, 1}, 4, 10, false).action == NormAction::kAccept);
    CHECK(judge_norm(NAN, {1, 1, 1}, 3, 10, false).action == NormAction::kRefuse);
    CHECK(judge_norm(1e6, {1e6}, 3, 10, false).action == NormAction::kWait);
    CHECK(judge_norm(1e6, {1e6}, 1, 10, false).action == NormAction::kAccept);  // one provider
    CHECK(judge_norm(1e6, {1}, 3, 0, false).action == NormAction::kAccept);
  }

  TEST_CASE("aggregation: a contribution 1000× its peers' norm is refused as an outlier and Δ is the others'; norms are judged once every provider has one") {
    common::FlatLayout layout;
    layout.append("w", {512});
    Aggregator agg(layout, 10);
    agg.begin({"a", "b", "c"});
    const auto honest = torch::full({512}, 0.01f);
    CHECK(agg.add("a", encoded(layout, honest * 1000, compress::Codec::kInt8), 100).empty());
    CHECK(agg.added() == 0);  // round 1: judged once all three have a norm
    CHECK(agg.add("b", encoded(layout, honest, compress::Codec::kInt8), 100).empty());
    CHECK(agg.added() == 0);
    const auto rejected = agg.add("c", encoded(layout, honest * 1.5, compress::Codec::kInt8), 100);
    REQUIRE(rejected.size() == 1);
    CHECK(rejected[0].peer == "a");
    CHECK(rejected[0].code == RefusalCode::kOutlier);
    CHECK(agg.finish().empty());
    CHECK(agg.added() == 2);
    CHECK(agg.delta()[0].item<float>() == doctest::Approx(0.0125).epsilon(0.01));
    // The next round compares with the last accepted norm of each provider: a lone outlier is
    // refused at once, against b's and c's.
    agg.begin({"a"});
    const auto next = agg.add("a", encoded(layout, honest * 1000, compress::Codec::kInt8), 100);
    REQUIRE(next.size() == 1);
    CHECK(next[0].code == RefusalCode::kOutlier);
    CHECK(next[0].reason.find("of 3 providers'") != std::string::npos);
  }

  TEST_CASE("aggregation: the norm reference survives a head restart through the checkpoint document; an older document without it still reads") {
    common::FlatLayout layout;
    layout.append("w", {512});
    const auto honest = torch::full({512}, 0.01f);
    Aggregator before(layout, 10);
    before.begin({"a", "b", "c"});
    for (const char* p : {"a", "b", "c"}) CHECK(before.add(p, encoded(layout, honest, compress::Codec::kInt8), 100).empty());
    CHECK(before.finish().empty());
    HeadCheckpointState st;
    for (const auto& [part, norms] : before.norm_history()) st.norm_history[std::to_string(part)] = norms;
    REQUIRE(st.norm_history.count("0"));
    CHECK(st.norm_history["0"].size() == 3);
    const auto back = nlohmann::json::parse(common::json_dump(nlohmann::json(st))).get<HeadCheckpointState>();
    Aggregator after(layout, 10);
    Aggregator::NormHistory restored;
    for (const auto& [part, norms] : back.norm_history) restored[std::stoul(part)] = norms;
    after.restore_norm_history(restored);
    after.begin({"a"});  // the first round after the restart: judged against b's and c's at once
    const auto r = after.add("a", encoded(layout, honest * 1000, compress::Codec::kInt8), 100);
    REQUIRE(r.size() == 1);
    CHECK(r[0].code == RefusalCode::kOutlier);
    auto old = nlohmann::json(st);
    old.erase("norm_history");
    CHECK(old.get<HeadCheckpointState>().norm_history.empty());
  }

  TEST_CASE("aggregation: two colluders of four cannot get a huge frame past the bar with a zero frame, in round 1 or later") {
    common::FlatLayout layout;
    layout.append("w", {512});
    const auto honest = torch::full({512}, 0.01f);
    for (const bool first_round : {true, false}) {
      CAPTURE(first_round);
      Aggregator agg(layout, 10);
      if (!first_round) {  // a round of the four, all honest, before
        agg.begin({"h1", "h2", "x", "y"});
        for (const char* p : {"h1", "h2", "x", "y"}) {
          CHECK(agg.add(p, encoded(layout, honest, compress::Codec::kInt8), 100).empty());
        }
        CHECK(agg.finish().empty());
      }
      agg.begin({"h1", "h2", "x", "y"});
      // The colluders come first: a zero frame, then one at 1e6 x the honest scale.
      CHECK(agg.add("x", encoded(layout, honest * 0, compress::Codec::kInt8), 100).empty());
      const auto rejected =
          add_and_finish(agg, layout, {{"y", honest * 1e6}, {"h1", honest * 1.1}, {"h2", honest * 1.1}});
      REQUIRE(rejected.size() == 1);
      CHECK(rejected[0].peer == "y");
      CHECK(rejected[0].code == RefusalCode::kOutlier);
      CHECK(agg.added() == 3);  // h1, h2 and the harmless zero
    }
  }

  TEST_CASE("judge_norm with outer.norm_clip: over the median it is accepted with a clip factor that makes it the median; under median / bound it is refused; the reason says so") {
    const auto over = judge_norm(4, {1, 2, 4, 8}, 4, 10, true, true);  // lower median 2
    CHECK(over.action == NormAction::kAccept);
    CHECK(over.clip == doctest::Approx(0.5));
    CHECK(over.reason.find("clipped to the median 2 of 4 providers'") != std::string::npos);
    const auto at = judge_norm(2, {1, 2, 4, 8}, 4, 10, true, true);
    CHECK(at.action == NormAction::kAccept);
    CHECK(at.clip == 1);
    CHECK(judge_norm(1, {1, 2, 4, 8}, 4, 10, true, true).clip == 1);  // under it: as sent
    // Still refused far over the bound, and now also far under it.
    CHECK(judge_norm(21, {1, 2, 4, 21}, 4, 10, true, true).action == NormAction::kRefuse);
    const auto tiny = judge_norm(0.1, {0.1, 2, 4, 8}, 4, 10, true, true);
    CHECK(tiny.action == NormAction::kRefuse);
    CHECK(tiny.reason.find("would only dilute") != std::string::npos);
    CHECK(judge_norm(0, {0, 2, 4, 8}, 4, 10, true, true).action == NormAction::kRefuse);
    // Without clipping (today's rule before it): a zero frame is accepted, a large one as sent.
    CHECK(judge_norm(0, {0, 2, 4, 8}, 4, 10, true, false).action == NormAction::kAccept);
    CHECK(judge_norm(8, {1, 2, 4, 8}, 4, 10, true, false).clip == 1);
  }

  TEST_CASE("aggregation with outer.norm_clip: a provider that scales its values ×9 moves Δ no more than one at the median; the relay's kept frames carry the same factor") {
    common::FlatLayout layout;
    layout.append("w", {512});
    const auto honest = torch::full({512}, 0.01f);
    for (const bool keep : {false, true}) {
      CAPTURE(keep);
      Aggregator agg(layout, 10, keep, /*norm_clip=*/true);
      agg.begin({"a", "b", "c", "x"});
      CHECK(agg.add("a", encoded(layout, honest, compress::Codec::kInt8), 100).empty());
      CHECK(agg.add("b", encoded(layout, honest, compress::Codec::kInt8), 100).empty());
      CHECK(agg.add("c", encoded(layout, honest, compress::Codec::kInt8), 100).empty());
      CHECK(agg.add("x", encoded(layout, honest * -9, compress::Codec::kInt8), 100).empty());
      CHECK(agg.finish().empty());
      CHECK(agg.added() == 4);
      REQUIRE(agg.clipped().size() == 1);
      CHECK(agg.clipped()[0].first == "x");
      CHECK(agg.clipped()[0].second == doctest::Approx(1.0 / 9).epsilon(0.01));
      if (keep) {
        REQUIRE(agg.kept().size() == 4);
        CHECK(agg.kept()[3].clip == doctest::Approx(1.0 / 9).epsilon(0.01));
        CHECK(agg.kept()[0].clip == 1.0f);
      } else {
        // (3 × 0.01 − 0.01) / 4: the reversed one counts as one honest provider's share, not 9.
        CHECK(agg.delta()[0].item<float>() == doctest::Approx(0.005).epsilon(0.01));
      }
    }
    // Without it (outer.norm_clip false), the same round: (3 × 0.01 − 0.09) / 4 = −0.015.
    Aggregator plain(layout, 10);
    plain.begin({"a", "b", "c", "x"});
    for (const char* p : {"a", "b", "c"}) CHECK(plain.add(p, encoded(layout, honest, compress::Codec::kInt8), 100).empty());
    CHECK(plain.add("x", encoded(layout, honest * -9, compress::Codec::kInt8), 100).empty());
    CHECK(plain.finish().empty());
    CHECK(plain.delta()[0].item<float>() == doctest::Approx(-0.015).epsilon(0.01));
  }

  TEST_CASE("aggregation with outer.norm_clip: a zero frame is refused rather than diluting the mean") {
    common::FlatLayout layout;
    layout.append("w", {512});
    const auto honest = torch::full({512}, 0.01f);
    Aggregator agg(layout, 10, false, true);
    agg.begin({"a", "b", "c", "z"});
    CHECK(agg.add("z", encoded(layout, honest * 0, compress::Codec::kInt8), 100).empty());
    const auto rejected = add_and_finish(agg, layout, {{"a", honest}, {"b", honest}, {"c", honest}});
    REQUIRE(rejected.size() == 1);
    CHECK(rejected[0].peer == "z");
    CHECK(rejected[0].code == RefusalCode::kOutlier);
    CHECK(agg.added() == 3);
    CHECK(agg.delta()[0].item<float>() == doctest::Approx(0.01).epsilon(0.01));  // not 0.0075
  }

  TEST_CASE("outer.score_relative: every contribution is scored before any is taken; one that lowers the loss by less than the fraction of the median fall is refused (low_score), with 3 or more scores and a falling median only") {
    common::FlatLayout layout;
    layout.append("w", {512});
    const auto honest = torch::full({512}, 0.01f);
    const std::map<std::string, double> change = {{"a", -1.7}, {"b", -1.8}, {"c", -1.6}, {"x", -0.08}};
    const auto scorer = [&](const std::string& peer, const net::Frame&, float) {
      return Aggregator::Score{change.at(peer), std::nullopt};
    };
    {
      Aggregator agg(layout, 10, false, true);
      agg.set_scorer(scorer, 0.5);
      agg.begin({"a", "b", "c", "x"});
      CHECK(agg.add("x", encoded(layout, honest, compress::Codec::kInt8), 100).empty());  // first in: waits
      const auto rejected = add_and_finish(agg, layout, {{"a", honest}, {"b", honest}, {"c", honest}});
      REQUIRE(rejected.size() == 1);
      CHECK(rejected[0].peer == "x");
      CHECK(rejected[0].code == RefusalCode::kLowScore);
      CHECK(rejected[0].reason.find("the median -1.7 of the round's 4 scored") != std::string::npos);
      CHECK(agg.added() == 3);
      CHECK(agg.scores().size() == 4);
    }
    {  // off: taken
      Aggregator agg(layout, 10, false, true);
      agg.set_scorer(scorer, 0);
      agg.begin({"a", "b", "c", "x"});
      CHECK(add_and_finish(agg, layout, {{"a", honest}, {"b", honest}, {"c", honest}, {"x", honest}}).empty());
      CHECK(agg.added() == 4);
    }
    {  // two scores: no median to speak of
      Aggregator agg(layout, 10, false, true);
      agg.set_scorer(scorer, 0.5);
      agg.begin({"a", "x"});
      CHECK(add_and_finish(agg, layout, {{"a", honest}, {"x", honest}}).empty());
      CHECK(agg.added() == 2);
    }
    {  // a median that is not a fall: the relative rule does not apply
      const auto rising = [](const std::string& peer, const net::Frame&, float) {
        return Aggregator::Score{peer == "x" ? -0.001 : 0.0, std::nullopt};
      };
      Aggregator agg(layout, 10, false, true);
      agg.set_scorer(rising, 0.5);
      agg.begin({"a", "b", "c", "x"});
      CHECK(add_and_finish(agg, layout, {{"a", honest}, {"b", honest}, {"c", honest}, {"x", honest}}).empty());
      CHECK(agg.added() == 4);
    }
  }

  TEST_CASE("aggregation quorum (liveness): a provider whose frame failed the head's checks, or a straggler the round does not wait for that sent nothing and was never accepted, leaves the quorum; one merely absent, or a straggler with an accepted norm, does not") {
    common::FlatLayout layout;
    layout.append("w", {512});
    const auto honest = torch::full({512}, 0.01f);
    for (const bool clip : {false, true}) {
      CAPTURE(clip);
      {  // one of two refused for a bad frame before the aggregator: the other is judged alone
        Aggregator agg(layout, 10, false, clip);
        agg.begin({"h", "x"});
        CHECK(agg.fault("x").empty());
        CHECK(agg.quorum_base() == 1);
        CHECK(add_and_finish(agg, layout, {{"h", honest}}).empty());
        CHECK(agg.added() == 1);
      }
      {  // ... or for a frame the aggregator itself could not decode
        Aggregator agg(layout, 10, false, clip);
        agg.begin({"h", "x"});
        auto bad = encoded(layout, honest, compress::Codec::kInt8);
        std::vector<uint8_t> bytes(bad.data(), bad.data() + bad.size());
        bytes.resize(bytes.size() / 2);  // truncated
        const auto r = agg.add("x", net::Frame(std::move(bytes)), 100);
        REQUIRE(r.size() == 1);
        CHECK(r[0].code == RefusalCode::kBadFrame);
        CHECK(add_and_finish(agg, layout, {{"h", honest}}).empty());
        CHECK(agg.added() == 1);
      }
      {  // merely absent (it may be slow and honest): no quorum, nothing accepted
        Aggregator agg(layout, 10, false, clip);
        agg.begin({"h", "x"});
        CHECK(agg.skip("x").empty());
        CHECK(agg.quorum_base() == 2);
        const auto rejected = add_and_finish(agg, layout, {{"h", honest}});
        REQUIRE(rejected.size() == 1);
        CHECK(rejected[0].reason.find("no quorum") != std::string::npos);
        CHECK(agg.added() == 0);
      }
      {  // a silent straggler never accepted leaves the quorum
        Aggregator agg(layout, 10, false, clip);
        agg.begin({"h", "x"}, 0, nullptr, 0, true, {"x"});
        CHECK(agg.quorum_base() == 1);
        CHECK(add_and_finish(agg, layout, {{"h", honest}}).empty());
        CHECK(agg.added() == 1);
      }
      {  // a straggler with an accepted norm keeps its place (and its norm is the reference's)
        Aggregator agg(layout, 10, false, clip);
        agg.begin({"h", "x", "y"});
        CHECK(add_and_finish(agg, layout, {{"h", honest}, {"x", honest}, {"y", honest}}).empty());
        agg.begin({"h", "x", "y"}, 0, nullptr, 0, true, {"x", "y"});
        CHECK(agg.quorum_base() == 3);
        CHECK(add_and_finish(agg, layout, {{"h", honest * 1.1}}).empty());
        CHECK(agg.added() == 1);
      }
    }
  }
  TEST_CASE("XLOCO_ATTACK (the attack table's test device): parsed per provider, malformed text refused by name, each attack what it says") {
    CHECK_FALSE(attack_for(nullptr, "p").has_value());
    CHECK_FALSE(attack_for("", "p").has_value());
    const char* env = "provider-3=scale:1000,provider-5=negate:9,provider-6=zero";
    CHECK_FALSE(attack_for(env, "provider-0").has_value());
    const auto a = attack_for(env, "provider-5");
    REQUIRE(a.has_value());
    CHECK(a->kind == AttackKind::kNegate);
    CHECK(a->factor == 9);
    for (const char* bad : {"provider-3=scale", "provider-3=scale:x", "provider-3=melt:2", "=zero", "zero"}) {
      CAPTURE(bad);
      CHECK_THROWS_AS(attack_for(bad, "provider-3"), common::ConfigError);
    }
    const auto d = torch::full({64}, 0.5f);
    CHECK(torch::allclose(apply_attack(*attack_for("p=scale:4", "p"), 1, d), d * 4));
    CHECK(torch::allclose(apply_attack(*attack_for("p=negate:9", "p"), 1, d), d * -9));
    CHECK(apply_attack(*attack_for("p=zero", "p"), 1, d).abs().sum().item<float>() == 0);
    CHECK(torch::allclose(apply_attack(*attack_for("p=ramp:2", "p"), 3, d), d * 4));
    const auto n = apply_attack(*attack_for("p=noise:9", "p"), 2, d);
    CHECK(n.norm().item<double>() == doctest::Approx(9 * d.norm().item<double>()).epsilon(1e-4));
    CHECK(torch::equal(n, apply_attack(*attack_for("p=noise:9", "p"), 2, d)));  // reproducible
  }

  TEST_CASE("trust_verdict: lr·‖Δ‖ within τ·‖θ‖ + floor·√n is left alone; beyond, scaled onto the radius; τ 0 is off") {
    std::vector<float> theta(100, 1.0f), delta(100, 0.05f);  // ‖θ‖ 10, ‖Δ‖ 0.5
    const TrustRegion region{0.1, 0.0};                        // radius 1
    auto v = trust_verdict(delta.data(), theta.data(), 100, 1.0, region);
    CHECK(v.scale == 1.0f);
    CHECK(v.ratio == doctest::Approx(0.5));
    v = trust_verdict(delta.data(), theta.data(), 100, 4.0, region);  // step 2: twice the radius
    CHECK(v.scale == doctest::Approx(0.5));
    CHECK(v.ratio == doctest::Approx(2.0));
    // A tensor at zero (a bias) may still move: the floor, per element.
    std::vector<float> zero(100, 0.0f);
    CHECK(trust_verdict(delta.data(), zero.data(), 100, 1.0, {0.1, 0.05}).scale == 1.0f);
    CHECK(trust_verdict(delta.data(), zero.data(), 100, 1.0, {0.1, 0.01}).scale == doctest::Approx(0.2));
    CHECK(trust_verdict(delta.data(), theta.data(), 100, 1e6, {0, 0}).scale == 1.0f);
  }

  TEST_CASE("outer step: one that would make theta or the momentum non-finite is found before it is taken") {
    common::OuterConfig c;  // lr 0.7, Nesterov 0.9
    OuterOptimizer opt(c, 4);
    auto theta = torch::zeros({4});
    auto delta = torch::tensor({0.1f, 0.2f, std::numeric_limits<float>::max(), 0.4f});
    const auto at = opt.non_finite_at(theta, delta);  // 0.7 · 1.9 · FLT_MAX overflows
    REQUIRE(at);
    CHECK(*at == 2);
    CHECK(!opt.non_finite_at(theta, torch::full({4}, 1e30f)));
    CHECK(torch::equal(opt.momentum(), torch::zeros({4})));  // looked, did not touch
  }

  TEST_CASE("log limiter: a burst per key and window, then the next line counts what was held back") {
    common::LogLimiter limit(2, 60);
    const auto t0 = common::LogLimiter::Clock::time_point{} + std::chrono::hours(1);
    CHECK(limit.check("a", t0).log);
    CHECK(limit.check("a", t0).log);
    CHECK(!limit.check("a", t0).log);
    CHECK(!limit.check("a", t0 + std::chrono::seconds(30)).log);
    CHECK(limit.check("b", t0).log);  // keys are counted apart
    const auto v = limit.check("a", t0 + std::chrono::seconds(61));
    CHECK(v.log);
    CHECK(v.held_back == 2);
    CHECK(common::LogLimiter::note(v) == " (2 similar lines held back)");
  }

  TEST_CASE("a restarted provider's saved state: resumed when it continues the run the head rejoins it to, else discarded with the reason") {
    const SavedProviderState saved{10, "base", "cfg"};
    // Round 10 still open, θ_pub the one round 10 started from: exact.
    auto v = judge_saved_state(saved, 9, "base", "cfg");
    CHECK(v.resume);
    CHECK(v.reason.find("still open") != std::string::npos);
    v = judge_saved_state(saved, 9, "other", "cfg");  // the head redid round 9
    CHECK(v.resume);
    CHECK(v.reason.find("redid") != std::string::npos);
    // The head closed round 10 (or a few more while it was down).
    CHECK(judge_saved_state(saved, 10, "x", "cfg").resume);
    CHECK(judge_saved_state(saved, 10 + kMaxStateLag, "x", "cfg").resume);
    v = judge_saved_state(saved, 11 + kMaxStateLag, "x", "cfg");
    CHECK(!v.resume);
    CHECK(v.reason.find("behind") != std::string::npos);
    // The head went back to an older checkpoint: a little, carried over; far, discarded.
    v = judge_saved_state(saved, 9 - kMaxStateLag, "x", "cfg");
    CHECK(v.resume);
    CHECK(v.reason.find("went back") != std::string::npos);
    v = judge_saved_state(saved, 8 - kMaxStateLag, "x", "cfg");
    CHECK(!v.resume);
    CHECK(v.reason.find("is back at round") != std::string::npos);
    // Another config, or no round at all.
    v = judge_saved_state(saved, 10, "x", "cfg2");
    CHECK(!v.resume);
    CHECK(v.reason.find("another config") != std::string::npos);
    CHECK(!judge_saved_state({0, "", "cfg"}, 0, "", "cfg").resume);
  }
}
