// Elastic, fault-tolerant rounds (issue 6) with real processes on loopback: a head and workers
// started one by one, so that each can be stopped, killed and restarted on its own, plus the
// pure decisions with an injected clock. Each TEST_CASE is one failure a rented GPU brings.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "common/config.h"
#include "compress/encoder.h"
#include "helpers.h"
#include "net/keys.h"
#include "net/protocol.h"
#include "net/zmq/transport.h"
#include "outer/head/membership.h"
#include "outer/round/round.h"
#include "outer/status/status_http.h"

// Last: LibTorch may pull in glog, whose CHECK would shadow doctest's.
#include <doctest/doctest.h>
#include <atomic>

using namespace xloco;
namespace fs = std::filesystem;
using nlohmann::json;
using test::jsonl;
using test::slurp;

namespace {

using Clock = outer::Clock;
Clock::time_point tp(double s) {
  return Clock::time_point{} + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// A head and named workers, each its own process group; everything is killed at scope exit.
struct Cluster {
  test::ScratchDir dir;
  std::string args;  // --config and --set for head and workers alike
  int port = test::free_port();
  fs::path keys, run;
  std::map<std::string, pid_t> pids;  // "head", provider names

  // `names`: the providers whose keys the head allow-lists (it reads them when it starts).
  Cluster(const std::string& tag, const std::string& extra, int providers,
          const std::vector<std::string>& names)
      : dir(tag) {
    args = " --config " + test::env_or("XLOCO_SOURCE_DIR", ".") + "/configs/kjv-tiny.json" +
           " --set run.dir=" + dir.str() + " --set run.name=el" +
           " --set model.d_model=32 --set model.n_layer=1 --set model.n_head=2"
           " --set model.seq_len=32 --set inner.batch_size=8 --set inner.warmup_steps=2"
           " --set inner.eval_batches=1 --set inner.log_every=10 --set outer.eval_every=5"
           " --set outer.heartbeat_s=0.25 --set outer.dead_after_s=3 --set outer.deadline_min_s=1"
           " --set outer.deadline_multiple=3 --set outer.start_grace_s=600"
           " --set outer.providers=" + std::to_string(providers) + extra;
    keys = dir.path / "keys";
    run = dir.path / "el";
    fs::create_directories(keys / "allow");
    key("head", false);
    for (const auto& n : names) key(n);
  }
  ~Cluster() {
    for (const auto& [name, pid] : pids) ::kill(-pid, SIGKILL);
    for (const auto& [name, pid] : pids) ::waitpid(pid, nullptr, 0);
  }

  void key(const std::string& name, bool allow = true) {
    const auto pair = net::generate_keypair();
    net::write_keypair(keys / name, pair);
    if (allow) std::ofstream(keys / "allow" / (name + ".pub")) << pair.public_key << "\n";
  }
  std::string log(const std::string& name) const { return (dir.path / (name + ".log")).string(); }
  std::string head_log() const { return slurp(log("head")); }
  std::string endpoint() const { return "tcp://127.0.0.1:" + std::to_string(port); }

  pid_t head(const std::string& more = "", const std::string& logname = "head") {
    const pid_t pid = test::start_group(
        "head" + args + " --bind " + endpoint() + " --key " + (keys / "head.key").string() +
            " --allow " + (keys / "allow").string() + " --http 127.0.0.1:0" + more,
        log(logname));
    REQUIRE(pid > 0);
    return pids["head"] = pid;
  }
  pid_t worker(const std::string& name, const std::string& more = "") {
    REQUIRE(fs::exists(keys / (name + ".key")));
    const pid_t pid = test::start_group(
        "worker" + args + " --head " + endpoint() + " --head-pub " + (keys / "head.pub").string() +
            " --key " + (keys / (name + ".key")).string() + more,
        log(name));
    REQUIRE(pid > 0);
    return pids[name] = pid;
  }
  std::vector<json> rounds() const { return jsonl(run / "metrics/head.jsonl"); }
  bool wait_rounds(size_t n) { return test::wait_rounds(run / "metrics/head.jsonl", n, pids["head"]); }
  // Waits for the head to exit; its exit code, or -1 after `seconds`.
  int wait_head(double seconds = 180) {
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
      int st = 0;
      if (::waitpid(pids["head"], &st, WNOHANG) == pids["head"]) {
        pids.erase("head");
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return -1;
  }
  bool alive(const std::string& name) {
    return ::waitpid(pids[name], nullptr, WNOHANG) == 0 && ::kill(pids[name], 0) == 0;
  }
  void kill(const std::string& name, int sig) { ::kill(-pids[name], sig); }
  void reap(const std::string& name) {
    ::waitpid(pids[name], nullptr, 0);
    pids.erase(name);
  }
  std::string status_url() const {
    std::string url;
    std::ifstream(run / "status.url") >> url;
    return url;
  }
  // The --set overrides of `args`, for a config built in this process.
  std::vector<std::string> overrides() const {
    std::vector<std::string> out;
    for (size_t at = args.find("--set "); at != std::string::npos; at = args.find("--set ", at + 1)) {
      const size_t begin = at + 6, end = args.find(' ', begin);
      out.push_back(args.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    }
    return out;
  }
};

// A TCP connection to 127.0.0.1:port; the socket.
int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    FAIL("cannot connect to 127.0.0.1:" << port);
  }
  return fd;
}

// A TCP connection to 127.0.0.1:PORT from the loopback address `from` (127.0.0.N); -1 when the
// server closed it at once.
int connect_from(const char* from, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in src{};
  src.sin_family = AF_INET;
  REQUIRE(::inet_pton(AF_INET, from, &src.sin_addr) == 1);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) == 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// TCP clients connected to 127.0.0.1:PORT that never send a byte; closed at scope exit
// (a failed assertion included) or by close().
struct IdleClients {
  std::vector<int> fds;
  IdleClients(int port, int n) {
    for (int i = 0; i < n; ++i) fds.push_back(connect_loopback(port));
  }
  ~IdleClients() { close(); }
  void close() {
    for (const int fd : fds) ::close(fd);
    fds.clear();
  }
};

// A raw GET with the given Host header; the reply's status line.
std::string status_line_for_host(int port, const std::string& path, const std::string& host) {
  const int fd = connect_loopback(port);
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n";
  REQUIRE(::send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size()));
  std::string reply;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) reply.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return reply.substr(0, reply.find("\r\n"));
}

bool contributed(const json& round, const std::string& provider) {
  return round.contains("frames") && round["frames"].contains(provider);
}

}  // namespace

TEST_SUITE("elastic_rules") {
  TEST_CASE("the deadline adapts to the median round time, within its bounds") {
    common::OuterConfig c;
    c.round_timeout_s = 100;
    c.deadline_multiple = 3;
    c.deadline_min_s = 2;
    CHECK(outer::round_deadline_s({}, c) == 100);             // nothing measured yet
    CHECK(outer::round_deadline_s({4, 5, 6}, c) == 15);       // 3 × median 5
    CHECK(outer::round_deadline_s({1, 9, 4, 6}, c) == 15);    // 3 × (4 + 6) / 2
    CHECK(outer::round_deadline_s({0.1, 0.2, 0.3}, c) == 2);  // never under deadline_min_s
    CHECK(outer::round_deadline_s({50, 60}, c) == 100);       // never over round_timeout_s
    CHECK(outer::round_deadline_s({4, 5, 6, 1000}, c) == 16.5);  // one straggler barely moves it

    // decide() uses the round's own deadline
    c.min_providers = 2;
    outer::RoundState s;
    s.round = 7;
    s.started = tp(1000);
    s.deadline_s = 15;
    s.active = {"a", "b", "c"};
    s.contributed = {{"a", 1}, {"b", 1}};
    CHECK(outer::decide(tp(1014), s, c).action == outer::RoundAction::kWait);
    const auto d = outer::decide(tp(1015.1), s, c);
    CHECK(d.action == outer::RoundAction::kClose);
    CHECK(d.reason.find("deadline (15.0s)") != std::string::npos);
    CHECK(d.reason.find("missing c") != std::string::npos);
    s.contributed.erase("b");  // past the deadline with 1 < min_providers: wait, saying why
    const auto w = outer::decide(tp(1020), s, c);
    CHECK(w.action == outer::RoundAction::kWait);
    CHECK(w.reason.find("past the deadline") != std::string::npos);
    CHECK(w.overdue);
    CHECK(!outer::decide(tp(1014), s, c).overdue);  // before the deadline: not overdue
  }

  TEST_CASE("a round does not wait for its stragglers, but counts them when they come in time") {
    common::OuterConfig c;
    c.min_providers = 1;
    c.round_timeout_s = 100;
    outer::RoundState s;
    s.started = tp(0);
    s.active = {"a", "b", "slow"};
    s.optional = {"slow"};
    s.contributed = {{"a", 1}};
    CHECK(outer::decide(tp(1), s, c).action == outer::RoundAction::kWait);
    s.contributed["b"] = 1;
    const auto d = outer::decide(tp(1), s, c);
    CHECK(d.action == outer::RoundAction::kClose);
    CHECK(d.reason == "all 2 active providers contributed; not waiting for straggling slow");
    s.contributed["slow"] = 1;
    CHECK(outer::decide(tp(1), s, c).reason == "all 3 active providers contributed");
    s.contributed = {};
    s.active = {"slow"};  // only stragglers: nothing closes before the deadline
    CHECK(outer::decide(tp(1), s, c).action == outer::RoundAction::kWait);
  }

  TEST_CASE("a round whose contributions were all refused closes, without an update, once nobody is left to wait for (it waits for a straggler until the deadline)") {
    common::OuterConfig c;
    c.min_providers = 2;
    c.round_timeout_s = 100;
    outer::RoundState s;
    s.started = tp(0);
    s.active = {"b"};  // a was refused: the head takes it out of active
    s.refused = {"a"};
    CHECK(outer::decide(tp(1), s, c).action == outer::RoundAction::kWait);  // b may still come
    s.active = {};
    s.refused = {"a", "b"};
    const auto d = outer::decide(tp(1), s, c);
    CHECK(d.action == outer::RoundAction::kClose);
    CHECK(d.reason == "every contribution was refused (a, b): nobody left to wait for");
    s.active = {"slow"};
    s.optional = {"slow"};
    CHECK(outer::decide(tp(1), s, c).action == outer::RoundAction::kWait);
    CHECK(outer::decide(tp(1), s, c).reason.find("waiting for straggling slow") != std::string::npos);
    CHECK(outer::decide(tp(100), s, c).action == outer::RoundAction::kClose);
    s.refused = {};  // nothing handed in at all (the providers died): it still waits
    s.active = {};
    CHECK(outer::decide(tp(200), s, c).action == outer::RoundAction::kWait);
  }

  TEST_CASE("round 1 waits for all K, then min_providers after the grace; later rounds pause below min_providers") {
    common::OuterConfig c;
    c.providers = 4;
    c.min_providers = 2;
    c.start_grace_s = 30;
    CHECK(!outer::decide_start(3, c, true, 10).start);
    CHECK(outer::decide_start(4, c, true, 10).start);
    CHECK(outer::decide_start(3, c, true, 31).start);  // grace over: min_providers
    CHECK(!outer::decide_start(1, c, true, 31).start);
    const auto paused = outer::decide_start(1, c, false);
    CHECK(!paused.start);
    CHECK(paused.reason.find("paused") != std::string::npos);
    CHECK(paused.reason.find("min_providers 2") != std::string::npos);
    CHECK(outer::decide_start(2, c, false).start);
  }

  TEST_CASE("/metrics text passes promtool and escapes label values") {
    outer::HeadStatus s;
    s.run = "r\"1";
    s.state = "paused";
    s.round = 3;
    s.total_rounds = 9;
    s.eval_loss = 2.5;
    s.bytes_up = 10;
    s.bytes_down = 20;
    s.providers.resize(2);
    s.providers[0].name = "a\\b";
    s.providers[0].state = "dead";
    s.providers[0].tokens_per_s = 1.5;
    s.providers[1].name = "c";
    s.providers[1].state = "active";
    s.providers[1].up = 1;
    const std::string text = outer::prometheus_text(s);
    CHECK(text.find("xloco_paused{run=\"r\\\"1\"} 1") != std::string::npos);
    CHECK(text.find("provider=\"a\\\\b\"") != std::string::npos);
    CHECK(text.find("xloco_providers{run=\"r\\\"1\",state=\"dead\"} 1") != std::string::npos);
    if (std::system("command -v promtool > /dev/null 2>&1") != 0) {
      MESSAGE("promtool not installed (Debian package prometheus): lint skipped");
      return;
    }
    test::ScratchDir dir("prom");
    std::ofstream(dir.path / "m.txt") << text;
    CHECK(std::system(("promtool check metrics < " + (dir.path / "m.txt").string()).c_str()) == 0);
  }

  TEST_CASE("status server: idle clients hold neither /status nor the server's end; beyond loopback it needs the token; addresses only for its holders") {
    using Clock = std::chrono::steady_clock;
    outer::HeadStatus s;
    s.run = "r";
    s.providers.resize(1);
    s.providers[0].name = "p0";
    s.providers[0].address = "10.1.2.3";
    const std::string token = "0123456789abcdef0123";
    auto server = std::make_unique<outer::StatusServer>("127.0.0.1:0", token);
    server->publish(s);
    const std::string url = server->url();
    const auto port = url.substr(url.rfind(':') + 1);
    IdleClients idle(std::stoi(port), 10);
    const auto t0 = Clock::now();
    const auto anonymous = nlohmann::json::parse(outer::http_get(url, "/status", 5));
    CHECK(std::chrono::duration<double>(Clock::now() - t0).count() < 1.0);
    CHECK(anonymous["providers"][0]["address"] == "");  // no token, no addresses
    const auto holder = nlohmann::json::parse(outer::http_get(url, "/status", 5, token));
    CHECK(holder["providers"][0]["address"] == "10.1.2.3");
    CHECK(nlohmann::json::parse(outer::http_get(url, "/status", 5, "wrong-token-0123456789"))["providers"][0]["address"] == "");
    const auto t1 = Clock::now();
    server.reset();  // with the idle clients still connected
    CHECK(std::chrono::duration<double>(Clock::now() - t1).count() < 1.0);
    idle.close();
    // Beyond loopback: a token is required, and every request must carry it.
    CHECK_THROWS_AS(outer::StatusServer("0.0.0.0:0"), common::ConfigError);
    CHECK_THROWS_AS(outer::StatusServer("0.0.0.0:0", "short"), common::ConfigError);
    outer::StatusServer open("0.0.0.0:0", token);
    open.publish(s);
    CHECK_THROWS_WITH(outer::http_get(open.url(), "/status", 5), doctest::Contains("HTTP 401"));
    CHECK(nlohmann::json::parse(outer::http_get(open.url(), "/status", 5, token))["providers"][0]["address"] == "10.1.2.3");
  }

  TEST_CASE("status server: token-less idle connections at 50 a second, from one address or from many, cannot lock out an authenticated /status") {
    using Clock = std::chrono::steady_clock;
    outer::HeadStatus st;
    st.run = "r";
    const std::string token = "0123456789abcdef0123";
    outer::StatusServer server("127.0.0.1:0", token);
    server.publish(st);
    const std::string url = server.url();
    const int port = std::stoi(url.substr(url.rfind(':') + 1));
    // A flood that never sends a byte and keeps every connection open, from 127.0.0.2 only or
    // from 127.0.0.2 ... 127.0.0.41 in turn, while an authenticated client asks every 100 ms.
    for (const int addresses : {1, 40}) {
      CAPTURE(addresses);
      std::atomic<bool> stop{false};
      std::vector<int> held;
      std::thread flood([&] {
        for (int i = 0; !stop && i < 400; ++i) {
          const std::string from = fmt::format("127.0.0.{}", 2 + i % addresses);
          if (const int fd = connect_from(from.c_str(), port); fd >= 0) held.push_back(fd);
          std::this_thread::sleep_for(std::chrono::milliseconds(20));  // 50 a second
        }
      });
      double worst = 0;
      int answered = 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the flood has filled up
      for (int k = 0; k < 25; ++k) {
        const auto t0 = Clock::now();
        try {
          const auto doc = nlohmann::json::parse(outer::http_get(url, "/status", 5, token));
          answered += doc["run"] == "r" ? 1 : 0;
        } catch (const std::exception& e) {
          MESSAGE("request " << k << " failed: " << e.what());
        }
        worst = std::max(worst, std::chrono::duration<double>(Clock::now() - t0).count());
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      // A burst of 100 at once from 20 addresses: past 64, the oldest waiting ones are evicted.
      std::vector<int> burst;
      for (int i = 0; i < 100; ++i) {
        if (const int fd = connect_from(fmt::format("127.0.0.{}", 100 + i % 20).c_str(), port); fd >= 0) burst.push_back(fd);
      }
      const auto t0 = Clock::now();
      CHECK_NOTHROW((void)outer::http_get(url, "/status", 5, token));
      worst = std::max(worst, std::chrono::duration<double>(Clock::now() - t0).count());
      stop = true;
      flood.join();
      for (const int fd : held) ::close(fd);
      for (const int fd : burst) ::close(fd);
      CHECK(answered == 25);
      CHECK(worst < 1.0);
      MESSAGE("addresses " << addresses << ": " << held.size() << " flood connections, slowest answer " << worst << " s");
    }
  }

  TEST_CASE("status server: GET / is the dashboard for anyone and loads nothing from elsewhere; /history?since=N and /run carry the data, behind the token beyond loopback") {
    const std::string token = "0123456789abcdef0123";
    outer::StatusServer open("0.0.0.0:0", token);
    // The page holds no data: served without the token, and self-contained (no CDN).
    const std::string page = outer::http_get(open.url(), "/", 5);
    CHECK(page == outer::dashboard_page());
    CHECK(page.find("id=\"loss-chart\"") != std::string::npos);
    CHECK(page.find("id=\"providers\"") != std::string::npos);
    CHECK(page.find("<script src") == std::string::npos);
    CHECK(page.find("https://") == std::string::npos);
    CHECK(page.find("#token=") != std::string::npos);  // how it finds the token
    for (const char* path : {"/history", "/history?since=0", "/run", "/status", "/metrics"}) {
      CAPTURE(path);
      CHECK_THROWS_WITH(outer::http_get(open.url(), path, 5), doctest::Contains("HTTP 401"));
    }
    outer::RunInfo info;
    info.run = "r";
    info.inner_steps = 50;
    info.baseline = {{50, 3.1}, {100, 2.5}};
    info.baseline_file = "runs/base/metrics/provider-0.jsonl";
    open.set_run(info);
    const auto run = nlohmann::json::parse(outer::http_get(open.url(), "/run", 5, token));
    CHECK(run["inner_steps"] == 50);
    CHECK(run["baseline"].size() == 2);
    CHECK(run["baseline"][1]["eval_loss"] == doctest::Approx(2.5));
    for (uint64_t r = 1; r <= 5; ++r) {
      outer::RoundRecord rec;
      rec.round = r;
      rec.bytes_up = 100.0 * static_cast<double>(r);
      rec.round_wall_s = 2;
      rec.compute_s = 1.5;
      if (r % 2 == 1) rec.eval_loss = 4.0 - static_cast<double>(r) / 10;
      open.add_round(rec);
    }
    // A head resumed from round 3's checkpoint records round 4 again: it replaces 4 and 5.
    outer::RoundRecord again;
    again.round = 4;
    again.bytes_up = 999;
    open.add_round(again);
    const auto all = nlohmann::json::parse(outer::http_get(open.url(), "/history", 5, token))["rounds"];
    REQUIRE(all.size() == 4);
    CHECK(all[3]["round"] == 4);
    CHECK(all[3]["bytes_up"] == 999);
    CHECK(all[0]["utilization"] == doctest::Approx(0.75));
    CHECK(all[0]["eval_loss"] == doctest::Approx(3.9));
    CHECK(all[1]["eval_loss"].is_null());
    const auto later = nlohmann::json::parse(outer::http_get(open.url(), "/history?since=2", 5, token))["rounds"];
    REQUIRE(later.size() == 2);
    CHECK(later[0]["round"] == 3);
    CHECK(nlohmann::json::parse(outer::http_get(open.url(), "/history?since=9", 5, token))["rounds"].empty());
    // A malformed query is refused, naming what it takes, not read as "the whole run".
    for (const char* bad : {"since=x", "since=", "since=-1", "since=2x", "since=99999999999999999999", "from=2", "since=2&since=3"}) {
      CAPTURE(bad);
      CHECK_FALSE(outer::parse_history_query(bad));
      CHECK_THROWS_WITH(outer::http_get(open.url(), std::string("/history?") + bad, 5, token),
                        doctest::Contains("HTTP 400"));
    }
    CHECK(outer::parse_history_query("") == uint64_t{0});
    CHECK(outer::parse_history_query("since=18446744073709551615") == UINT64_MAX);
    // A replaced round changes the history's epoch, so that a page holding the old ones starts over.
    const auto epoch = nlohmann::json::parse(outer::http_get(open.url(), "/history", 5, token))["epoch"];
    open.add_round(again);
    CHECK(nlohmann::json::parse(outer::http_get(open.url(), "/history", 5, token))["epoch"] != epoch);
    // On loopback, without the token, only requests addressed to a loopback name are answered
    // (a page elsewhere whose DNS name was rebound to 127.0.0.1 cannot read the data).
    outer::StatusServer local("127.0.0.1:0");
    const int port = std::stoi(local.url().substr(local.url().rfind(':') + 1));
    CHECK(status_line_for_host(port, "/status", "127.0.0.1:" + std::to_string(port)).find(" 200 ") != std::string::npos);
    CHECK(status_line_for_host(port, "/history", "localhost:" + std::to_string(port)).find(" 200 ") != std::string::npos);
    CHECK(status_line_for_host(port, "/history", "[::1]:" + std::to_string(port)).find(" 200 ") != std::string::npos);
    CHECK(status_line_for_host(port, "/status", "rebound.example:" + std::to_string(port)).find(" 403 ") != std::string::npos);
    CHECK(status_line_for_host(port, "/", "rebound.example").find(" 200 ") != std::string::npos);  // the page holds no data
  }

  TEST_CASE("read_baseline: the eval points of an xloco train run; a missing or malformed file is refused by name and line") {
    test::ScratchDir dir("baseline");
    const auto file = (dir.path / "provider-0.jsonl").string();
    std::ofstream(file) << "{\"step\": 10, \"loss\": 3.0}\n{\"step\": 50, \"eval_loss\": 2.5}\n\n"
                           "{\"step\": 100, \"eval_loss\": 2.1}\n";
    const auto points = outer::read_baseline(file);
    REQUIRE(points.size() == 2);
    CHECK(points[1].step == 100);
    CHECK(points[1].eval_loss == doctest::Approx(2.1));
    CHECK_THROWS_WITH_AS(outer::read_baseline((dir.path / "none.jsonl").string()), doctest::Contains("none.jsonl"), common::IoError);
    std::ofstream(dir.path / "bad.jsonl") << "{\"step\": 1, \"eval_loss\": 2}\nnot json\n";
    CHECK_THROWS_WITH_AS(outer::read_baseline((dir.path / "bad.jsonl").string()), doctest::Contains("line 2"), common::IoError);
    std::ofstream(dir.path / "steps.jsonl") << "{\"step\": 1, \"loss\": 2}\n";
    CHECK_THROWS_WITH_AS(outer::read_baseline((dir.path / "steps.jsonl").string()), doctest::Contains("no eval_loss"), common::IoError);
    std::ofstream(dir.path / "nostep.jsonl") << "{\"eval_loss\": 2}\n";
    CHECK_THROWS_WITH_AS(outer::read_baseline((dir.path / "nostep.jsonl").string()), doctest::Contains("integer step"), common::IoError);
  }

  TEST_CASE("a provider's busy share: compute its contributions report over the time between its first and last; null before its second; clamped") {
    outer::Members members;
    auto& m = members["p"];
    const auto t0 = outer::Clock::now();
    CHECK_FALSE(outer::provider_statuses(members, t0)[0].busy.has_value());
    m.first_contribution = m.last_contribution = t0;
    CHECK_FALSE(outer::provider_statuses(members, t0)[0].busy.has_value());
    m.last_contribution = t0 + std::chrono::seconds(20);
    m.compute_since_first_s = 19;
    CHECK(*outer::provider_statuses(members, t0)[0].busy == doctest::Approx(0.95));
    m.compute_since_first_s = 400;  // a claim beyond the wall time
    CHECK(*outer::provider_statuses(members, t0)[0].busy == 1.0);
  }
}

TEST_SUITE("elastic") {
  TEST_CASE("the head with idle TCP clients on its status port: /status answers within 1 s and SIGTERM ends it within 5 s") {
    using SteadyClock = std::chrono::steady_clock;
    Cluster c("sigterm", "", 2, {"p0", "p1"});
    c.head();  // no providers: it waits for them, serving /status
    REQUIRE(test::wait_for_text(c.log("head"), "status: http://", 60));
    const std::string url = c.status_url();
    REQUIRE(!url.empty());
    const int port = std::stoi(url.substr(url.rfind(':') + 1));
    IdleClients idle(port, 8);
    const auto t0 = SteadyClock::now();
    const auto status = nlohmann::json::parse(outer::http_get(url, "/status", 5));
    CHECK(std::chrono::duration<double>(SteadyClock::now() - t0).count() < 1.0);
    CHECK(status["run"] == "el");
    const auto t1 = SteadyClock::now();
    c.kill("head", SIGTERM);
    const int rc = c.wait_head(30);
    const double took = std::chrono::duration<double>(SteadyClock::now() - t1).count();
    idle.close();
    INFO(c.head_log());
    CHECK(rc >= 0);
    CHECK(took < 5.0);
  }

  TEST_CASE("a frozen provider misses the deadline, a killed one is dead; restarted, it rejoins with full state and counts") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
    }
    Cluster c("kill", " --set inner.steps=1600 --set outer.inner_steps=20 --set outer.min_providers=2", 3,
              {"p0", "p1", "p2"});
    c.head();
    for (const char* p : {"p0", "p1", "p2"}) c.worker(p);
    REQUIRE(c.wait_rounds(3));
    // SIGSTOP: its TCP link stays up, so only the deadline can close the round without it.
    c.kill("p1", SIGSTOP);
    const size_t stopped_at = c.rounds().size();
    REQUIRE(c.wait_rounds(stopped_at + 3));
    bool deadline_close = false;
    for (const auto& r : c.rounds()) {
      if (r["reason"].get<std::string>().find("deadline") != std::string::npos &&
          r["participants"] == 2 && !contributed(r, "p1")) {
        deadline_close = true;
        CHECK(r["round_s"].get<double>() >= r["deadline_s"].get<double>());
      }
    }
    INFO(c.head_log());
    CHECK(deadline_close);
    CHECK(test::wait_for_text(c.log("head"), "provider p1: straggling -> dead (silent for", 30));

    // xloco status lists every provider with its state; /metrics passes promtool.
    const auto table = test::run_xloco("status --run " + c.run.string());
    CHECK(table.code == 0);
    for (const char* line : {"p0 ", "p1 ", "p2 "}) CHECK(table.out.find(line) != std::string::npos);
    CHECK(table.out.find("dead") != std::string::npos);
    CHECK(table.out.find("active") != std::string::npos);
    const auto metrics = test::run_xloco("status --run " + c.run.string() + " --metrics");
    CHECK(metrics.code == 0);
    CHECK(metrics.out.find("xloco_providers{run=\"el\",state=\"dead\"} 1") != std::string::npos);
    if (std::system("command -v promtool > /dev/null 2>&1") == 0) {
      std::ofstream(c.dir.path / "metrics.txt") << metrics.out;
      CHECK(std::system(("promtool check metrics < " + (c.dir.path / "metrics.txt").string()).c_str()) == 0);
    } else {
      MESSAGE("promtool not installed (Debian package prometheus): lint skipped");
    }

    c.kill("p1", SIGKILL);
    c.reap("p1");
    c.worker("p1");
    REQUIRE(test::wait_for_text(c.log("head"), "provider p1 rejoined at round", 60));
    // Its saved AdamW state and residual are from before the freeze, rounds ago: discarded,
    // with the reason (leader_rules.h judge_saved_state).
    CHECK(test::wait_for_text(c.log("p1"), "discarded: it was saved after round", 10));
    const std::string log = c.head_log();
    const auto line = log.substr(log.find("provider p1 rejoined at round"));
    CHECK(line.substr(0, line.find('\n')).find("full state") != std::string::npos);
    bool counted = false;
    for (int i = 0; i < 600 && !counted; ++i) {
      for (const auto& r : c.rounds()) counted = counted || (r["round"] > stopped_at + 3 && contributed(r, "p1"));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    CHECK(counted);
    CHECK(c.wait_head() == 0);
    const auto last = c.rounds().back();
    CHECK(last["round"] == 80);
    CHECK(last["participants"] == 3);
  }

  TEST_CASE("kill -9 of the head after a checkpoint: head --resume continues and the same providers reconnect") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
    }
    Cluster c("headkill", " --set inner.steps=1200 --set outer.inner_steps=20 --set outer.checkpoint_every=4"
                          " --set outer.min_providers=2", 2, {"p0", "p1"});
    c.head();
    c.worker("p0");
    c.worker("p1");
    REQUIRE(c.wait_rounds(6));  // checkpoint at round 4, and the providers are past it
    c.kill("head", SIGKILL);
    c.reap("head");
    std::string latest;
    std::ifstream(c.run / "ckpt/latest") >> latest;
    const auto state = json::parse(std::ifstream(c.run / "ckpt" / latest / "state.json"));
    const uint64_t ckpt = state["round"];
    CHECK(ckpt >= 4);
    const size_t before = c.rounds().size();  // usually past the checkpoint: a full resync
    c.head(" --auto-resume", "head2");  // what a restarted container does (deploy/akash/head.yaml)
    REQUIRE(test::wait_rounds(c.run / "metrics/head.jsonl", before + 4, c.pids["head"]));
    const std::string log2 = slurp(c.log("head2"));
    INFO(log2);
    CHECK(log2.find("auto-resume: continuing from " + (c.run / "ckpt").string()) != std::string::npos);
    CHECK(log2.find("resumed from") != std::string::npos);
    CHECK(log2.find("provider p0 joined at round " + std::to_string(ckpt)) != std::string::npos);
    const auto all = c.rounds();
    CHECK(all[before]["round"] == ckpt + 1);  // the first round after the resume
    for (size_t i = before + 1; i < all.size(); ++i) {
      CHECK(all[i]["participants"] == 2);
    }
    CHECK(c.alive("p0"));  // never restarted
    CHECK(c.alive("p1"));
    CHECK(slurp(c.log("p0")).find("rejoining the head") != std::string::npos);
    CHECK(c.wait_head() == 0);
  }

  TEST_CASE("a provider started at round 3 joins at a boundary without delaying the round, and counts from the next") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
    }
    // deadline_min_s 10: a slow machine starting p3's LibTorch must not push the round in
    // progress past a 1 s deadline; the check is that the join itself holds nothing up.
    Cluster c("late", " --set inner.steps=800 --set outer.inner_steps=20 --set outer.min_providers=3"
                      " --set outer.start_grace_s=0 --set outer.deadline_min_s=10", 4,
              {"p0", "p1", "p2", "p3"});
    c.head();
    for (const char* p : {"p0", "p1", "p2"}) c.worker(p);
    REQUIRE(c.wait_rounds(3));
    c.worker("p3");
    REQUIRE(test::wait_for_text(c.log("head"), "provider p3 joined", 60));
    CHECK(c.wait_head() == 0);
    const std::string log = c.head_log();
    INFO(log);
    const std::string needle = "provider p3 joined at round ";
    const auto at_pos = log.find(needle);
    REQUIRE(at_pos != std::string::npos);
    const uint64_t joined_at = std::stoull(log.substr(at_pos + needle.size()));
    CHECK(joined_at >= 3);
    const auto all = c.rounds();
    REQUIRE(all.size() == 40);
    // The round in progress at the join closed on its own providers, within its deadline.
    const auto& during = all[joined_at];  // round joined_at + 1
    CHECK(during["round"] == joined_at + 1);
    CHECK(!contributed(during, "p3"));
    CHECK(during["round_s"].get<double>() <= during["deadline_s"].get<double>());
    CHECK(during["reason"].get<std::string>().find("all 3 active providers contributed") != std::string::npos);
    // From the next round on, it counts.
    CHECK(contributed(all[joined_at + 1], "p3"));
    CHECK(all.back()["participants"] == 4);
  }

  TEST_CASE("below min_providers the head pauses and says why; a provider's SIGTERM is a BYE; it continues when one comes back") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
    }
    Cluster c("pause", " --set inner.steps=600 --set outer.inner_steps=20 --set outer.min_providers=2", 2,
              {"p0", "p1"});
    c.head();
    c.worker("p0");
    c.worker("p1");
    REQUIRE(c.wait_rounds(3));
    c.kill("p1", SIGTERM);
    c.reap("p1");
    REQUIRE(test::wait_for_text(c.log("head"), "paused: 1 live providers, below min_providers 2", 60));
    CHECK(c.head_log().find("provider p1: active -> left (said goodbye: provider interrupted)") != std::string::npos);
    // The round in progress when p1 left closes with p0 (the pause is logged as it closes, its
    // line just after), and /status is published every 0.25 s: let both settle, then watch.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const auto paused_at = json::parse(outer::http_get(c.status_url(), "/status"))["round"].get<uint64_t>();
    const size_t lines_at = c.rounds().size();
    std::this_thread::sleep_for(std::chrono::seconds(2));
    const auto st = json::parse(outer::http_get(c.status_url(), "/status"));
    CHECK(st["round"].get<uint64_t>() == paused_at);  // nothing moves while paused
    CHECK(c.rounds().size() == lines_at);
    CHECK(lines_at == paused_at);
    CHECK(st["state"] == "paused");
    CHECK(st["reason"].get<std::string>().find("min_providers 2") != std::string::npos);
    for (const auto& p : st["providers"]) CHECK(p["address"] == "");  // no token: no addresses
    c.worker("p1");
    CHECK(c.wait_head() == 0);
    CHECK(c.rounds().back()["round"] == 30);
    CHECK(c.rounds().back()["participants"] == 2);
  }

  TEST_CASE("wrong config, unlisted key, stale or future rounds and wrong shapes are refused by name; the run is unharmed") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
    }
    Cluster c("refuse", " --set inner.steps=800 --set outer.inner_steps=20 --set outer.min_providers=2"
                        " --set outer.start_grace_s=0", 3,  // a third shard for the rogue
              {"p0", "p1", "wrongcfg", "rogue"});
    c.head();
    c.worker("p0");
    c.worker("p1");
    REQUIRE(c.wait_rounds(2));
    // A different model: a different config hash.
    c.worker("wrongcfg", " --set model.d_model=48");
    // A key the head never allow-listed.
    const auto stranger = net::generate_keypair();
    net::write_keypair(c.keys / "stranger", stranger);
    c.worker("stranger", " --set outer.head_timeout_s=4");
    // An allow-listed rogue speaking the protocol by hand.
    net::zeromq::ClientOptions co;
    co.connect = c.endpoint();
    co.name = "rogue";
    co.key = net::load_keypair((c.keys / "rogue.key").string());
    co.server_public_key = net::load_public_key((c.keys / "head.pub").string());
    auto rogue = std::make_unique<net::zeromq::Client>(co);
    const std::string run = "el";
    const auto cfg = common::load_config(test::env_or("XLOCO_SOURCE_DIR", ".") + "/configs/kjv-tiny.json",
                                         c.overrides());
    const auto send = [&](net::Body b, uint64_t r) {
      return rogue->send(net::kHeadPeer, net::encode({run, r, std::move(b)}));
    };
    const auto expect = [&](net::MessageType type, double seconds) -> std::optional<net::Envelope> {
      const auto end = Clock::now() + std::chrono::duration<double>(seconds);
      while (Clock::now() < end) {
        send(net::Heartbeat{}, 0);  // stays live, so its later messages are judged on content
        auto rx = rogue->receive(std::chrono::milliseconds(100));
        if (!rx) continue;
        auto env = net::decode(rx->message, run);
        if (env.type() == type) return env;
      }
      return std::nullopt;
    };
    REQUIRE(send(net::Hello{"rogue", common::config_hash(cfg), 0, ""}, 0) == net::SendStatus::kSent);
    REQUIRE(expect(net::MessageType::kWelcome, 30));
    const auto start = expect(net::MessageType::kRoundStart, 30);
    REQUIRE(start);
    const uint64_t r = start->round;
    compress::CodecConfig cc;
    cc.codec = compress::Codec::kInt8;
    const std::vector<float> junk(3, 0.5f);
    const auto wrong = compress::Encoder(cc).encode({{"x", {3}, junk.data()}});
    net::Contribution bad;
    bad.tokens = 100;
    bad.payload = net::Frame(wrong);
    send(bad, r + 5);  // a future round
    auto reply = expect(net::MessageType::kError, 10);
    REQUIRE(reply);
    CHECK(std::get<net::ErrorReply>(reply->body).code == net::RefusalCode::kFutureRound);
    send(bad, r);  // wrong shapes
    reply = expect(net::MessageType::kError, 10);
    REQUIRE(reply);
    CHECK(std::get<net::ErrorReply>(reply->body).code == net::RefusalCode::kBadFrame);
    const auto next = expect(net::MessageType::kRoundStart, 30);  // r closed at its deadline
    REQUIRE(next);
    send(bad, r);  // a stale round
    std::this_thread::sleep_for(std::chrono::seconds(1));
    // Gone before the head ends: libzmq 4.3.4 can abort in a client whose unread input stalled
    // its connection when the peer then closes (the workers' link thread always reads).
    rogue.reset();

    CHECK(c.wait_head() == 0);
    const std::string log = c.head_log();
    INFO(log);
    CHECK(log.find("refused wrongcfg: provider wrongcfg has config hash") != std::string::npos);
    CHECK(log.find("is not on the allow-list") != std::string::npos);
    CHECK(log.find("refused rogue: contribution of rogue for round " + std::to_string(r + 5)) != std::string::npos);
    CHECK(log.find("refused rogue: contribution of rogue for round " + std::to_string(r) + ": ") != std::string::npos);
    CHECK(log.find("dropped a contribution from rogue for round " + std::to_string(r)) != std::string::npos);
    CHECK(slurp(c.log("wrongcfg")).find("config hash") != std::string::npos);
    c.reap("stranger");  // gives up after outer.head_timeout_s = 4 s of silence
    CHECK(slurp(c.log("stranger")).find("silent") != std::string::npos);
    // Unharmed: every round closed, p0 and p1 in all of them.
    const auto all = c.rounds();
    CHECK(all.size() == 40);
    for (const auto& x : all) {
      CHECK(contributed(x, "p0"));
      CHECK(contributed(x, "p1"));
    }
  }

  TEST_CASE("a rogue allow-listed client that never reads: the head stays up, the honest rounds keep their pace, the rogue is dead, the head's memory is bounded") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
    }
    // A 3.2 M-parameter model: a full state (12.8 MB) is what a join costs the head's link.
    Cluster c("rogue", " --set inner.steps=1000000 --set outer.inner_steps=10 --set outer.min_providers=2"
                       " --set model.d_model=256 --set model.n_layer=4 --set model.n_head=4"
                       " --set outer.start_grace_s=0", 3, {"p0", "p1", "rogue"});
    c.head();
    c.worker("p0");
    c.worker("p1");
    REQUIRE(c.wait_rounds(12));
    const auto round_gaps = [&](size_t from) {  // seconds between consecutive round closes
      std::vector<double> gaps;
      const auto all = c.rounds();
      for (size_t i = std::max<size_t>(from, 1); i < all.size(); ++i) {
        gaps.push_back(all[i]["round_wall_s"].get<double>());
      }
      std::sort(gaps.begin(), gaps.end());
      return gaps;
    };
    const auto before = round_gaps(4);
    const size_t rogue_from = c.rounds().size();
    const auto head_rss = [&] {
      std::ifstream in("/proc/" + std::to_string(c.pids["head"]) + "/status");
      std::string line;
      while (std::getline(in, line)) {
        if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
      }
      return 0LL;
    };
    const long long rss_before = head_rss();
    long long rss_peak = rss_before;
    {
      net::zeromq::ClientOptions co;
      co.connect = c.endpoint();
      co.key = net::load_keypair((c.keys / "rogue.key").string());
      co.server_public_key = net::load_public_key((c.keys / "head.pub").string());
      co.link.receive_hwm = 1;
      co.link.linger = std::chrono::milliseconds(0);
      net::zeromq::Client rogue(co);  // sends, and never reads
      const auto cfg = common::load_config(test::env_or("XLOCO_SOURCE_DIR", ".") + "/configs/kjv-tiny.json",
                                           c.overrides());
      // dead_after_s is 3 here: 25 s is eight times what the rogue needs to be found dead.
      const auto end = Clock::now() + std::chrono::seconds(25);
      while (Clock::now() < end) {
        (void)rogue.send(net::kHeadPeer, net::encode({"el", 0, net::Hello{"rogue", common::config_hash(cfg), 0, "", -1}}));
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        rss_peak = std::max(rss_peak, head_rss());
        REQUIRE(c.alive("head"));
      }
    }
    const auto during = round_gaps(rogue_from + 1);
    const double median_before = before[before.size() / 2], median_during = during[during.size() / 2];
    const std::string log = c.head_log();
    INFO(log.substr(log.size() > 20000 ? log.size() - 20000 : 0));
    MESSAGE("round wall: median " << median_before << " s without the rogue (" << before.size()
            << " rounds), " << median_during << " s with it (" << during.size() << " rounds, longest "
            << during.back() << " s); head RSS " << rss_before / (1 << 20) << " MiB before, peak "
            << rss_peak / (1 << 20) << " MiB with the rogue");
    CHECK(c.alive("head"));
    CHECK(log.find("Assertion") == std::string::npos);
    CHECK(median_during <= 1.5 * median_before);  // the same pace, give or take this machine's noise
    CHECK(log.find("provider rogue: ") != std::string::npos);
    CHECK(log.find("-> dead (its link took nothing for") != std::string::npos);
    CHECK(rss_peak - rss_before < (96LL << 20));
    // The honest providers were in every round.
    for (size_t i = rogue_from; i < c.rounds().size(); ++i) {
      CHECK(contributed(c.rounds()[i], "p0"));
      CHECK(contributed(c.rounds()[i], "p1"));
    }
  }

  TEST_CASE("a worker configured only through XLOCO_* environment variables, secrets as Z85 text, joins and counts") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
    }
    Cluster c("env", " --set inner.steps=200 --set outer.inner_steps=20 --set outer.min_providers=2", 2,
              {"p0", "envp"});
    c.head(" --auto-resume");  // nothing to resume yet: it starts the run
    c.worker("p0");
    std::string secret, head_pub, overrides;
    std::ifstream(c.keys / "envp.key") >> secret;
    std::ifstream(c.keys / "head.pub") >> head_pub;
    for (const auto& o : c.overrides()) overrides += (overrides.empty() ? "" : ",") + o;
    const std::map<std::string, std::string> env = {
        {"XLOCO_CONFIG", test::env_or("XLOCO_SOURCE_DIR", ".") + "/configs/kjv-tiny.json"},
        {"XLOCO_SET", overrides}, {"XLOCO_HEAD", c.endpoint()}, {"XLOCO_HEAD_PUB", head_pub},
        {"XLOCO_KEY", secret}, {"XLOCO_NAME", "envp"}};
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    c.pids["envp"] = test::start_group("worker", c.log("envp"));
    for (const auto& [k, v] : env) ::unsetenv(k.c_str());
    CHECK(c.wait_head() == 0);
    INFO(slurp(c.log("envp")));
    CHECK(c.head_log().find("provider envp joined at round 0") != std::string::npos);
    CHECK(c.head_log().find("auto-resume: no checkpoint under") != std::string::npos);
    CHECK(slurp(c.log("envp")).find(secret) == std::string::npos);  // never logged
    const auto all = c.rounds();
    REQUIRE(all.size() == 10);
    for (const auto& r : all) CHECK(contributed(r, "envp"));
  }
}
