// The head's status endpoint (design §8): GET / (the dashboard, one self-contained page),
// /status (JSON), /history?since=N (the rounds after N, for the dashboard's curves), /run (the
// config and the baseline curve) and /metrics (Prometheus text format 0.0.4), over
// asynchronous Boost.Beast on its own thread, so a slow or hostile client never touches the
// round loop: each connection has a 5 s deadline, 64 are served at once, and the server stops
// at once with clients connected. It binds 127.0.0.1 unless told otherwise; beyond loopback
// every request but the page itself (which holds no data) needs the bearer token, and provider
// addresses are shown only to callers that present it. The page sends the token it finds in
// its URL's fragment (http://HOST:PORT/#token=TOKEN: a fragment never leaves the browser).
// The head publishes a snapshot after each change and each round as it is recorded. Also the
// small HTTP GET that `xloco status` uses.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "outer/status/documents.h"

namespace xloco::outer {

class StatusServer {
 public:
  // Binds "HOST:PORT" (PORT 0 = a free one; no HOST = 127.0.0.1) and starts serving; throws
  // common::ConfigError naming the address when it cannot, or when HOST is not loopback and
  // `token` (--http-token) is empty.
  explicit StatusServer(const std::string& bind, const std::string& token = "");
  ~StatusServer();  // stops the thread; open connections are dropped
  StatusServer(const StatusServer&) = delete;
  StatusServer& operator=(const StatusServer&) = delete;

  // Starts one on `bind` and writes its URL to RUN_DIR/status.url, where `xloco status --run`
  // finds it.
  static std::unique_ptr<StatusServer> start(const std::string& bind, const std::string& run_dir,
                                             const std::string& token = "");

  void publish(HeadStatus status);
  void set_run(RunInfo info);                // GET /run
  void add_round(const RoundRecord& record);  // GET /history: in order, a repeat replaces
  std::string url() const;  // http://HOST:PORT

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The dashboard page (src/outer/dashboard.html, compiled in).
const std::string& dashboard_page();

// /metrics from a /status snapshot: every metric with HELP and TYPE, counters named *_total,
// label values escaped.
std::string prometheus_text(const HeadStatus& status);

// GET `path` from `base` (http://HOST:PORT); returns the body of a 200 reply and throws
// common::Error naming the URL and the reason otherwise.
// `token`, when set, goes as `Authorization: Bearer TOKEN`.
std::string http_get(const std::string& base, const std::string& path, double timeout_s = 5,
                     const std::string& token = "");

// /history's query: "" (every round) or "since=N", N a decimal round number: the rounds after N.
// Anything else is nullopt (the server answers 400 and names it).
std::optional<uint64_t> parse_history_query(const std::string& query);

// 127.0.0.0/8, ::1 and "localhost".
bool is_loopback_host(const std::string& host);
// "HOST:PORT" (HOST may be "[v6]", and defaults to 127.0.0.1 when empty); throws ConfigError
// naming `what` when there is no port.
std::pair<std::string, std::string> split_host_port(const std::string& text, const std::string& what);

// The `xloco status` table: one line per provider (state, last round, tokens/s, bytes, last
// seen) under a line about the run.
std::string status_table(const HeadStatus& status);

}  // namespace xloco::outer
