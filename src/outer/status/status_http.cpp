#include "outer/status/status_http.h"
#include "common/json_text.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cmath>
#include <charconv>
#include <chrono>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <sodium.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/metrics.h"

namespace xloco::outer {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;
using nlohmann::json;

std::pair<std::string, std::string> split_host_port(const std::string& text, const std::string& what) {
  const auto colon = text.rfind(':');
  XLOCO_ENFORCE(colon != std::string::npos && colon + 1 < text.size(), common::ConfigError,
                "{} \"{}\" must be HOST:PORT", what, text);
  std::string host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return {host.empty() ? "127.0.0.1" : host, text.substr(colon + 1)};
}

namespace {

// A blocking socket that gives up on a silent peer (http_get, the client side).
void set_timeouts(int fd, double seconds) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(seconds);
  tv.tv_usec = static_cast<suseconds_t>((seconds - static_cast<double>(tv.tv_sec)) * 1e6);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

std::string escape_label(const std::string& v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

bool equal_secret(const std::string& a, const std::string& b) {
  return a.size() == b.size() && sodium_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(host, ec);
  return !ec && addr.is_loopback();
}

// Asynchronous: every connection has 1 s to send its request headers and 5 s for the whole
// exchange; many are served at once on the one thread, and none can hold the others (or the
// head's exit) up. Slots are not first come, first served (design §10): at 64 connections, or 8
// from one address, a newcomer evicts the oldest connection (of that address, at its cap) that
// has not sent its headers yet, so idle connections opened without a token cannot lock out a
// client that asks at once. It is refused only when every slot is serving a request.
struct StatusServer::Impl {
  static constexpr int kMaxConnections = 64;
  static constexpr int kMaxPerAddress = 8;
  static constexpr auto kDeadline = std::chrono::seconds(5);
  static constexpr auto kHeaderDeadline = std::chrono::seconds(1);
  struct Session;
  struct Waiting {
    std::weak_ptr<Session> session;
    std::string address;
  };
  std::list<Waiting> waiting;               // connections without their headers, oldest first
  std::map<std::string, int> per_address;   // open connections by peer address
  uint64_t evicted = 0;                     // the io thread only, like these
  asio::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::thread thread;
  mutable std::mutex mu;
  HeadStatus status;
  std::string run_json = "{}";           // GET /run, serialised once
  std::vector<HistoryPoint> history;     // by round, ascending
  // Changes whenever rounds already served are replaced (a resume from an older checkpoint) and
  // differs between head processes, so that a page holding older rounds starts over.
  uint64_t replaced = 0;
  const std::string instance = std::to_string(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  std::string host, token;
  bool open_bind = false;  // bound beyond loopback: every request needs the token
  int connections = 0;     // the io thread only

  // Closes the oldest connection still waiting for its headers (of `address`, if given).
  bool evict_oldest(const std::string* address) {
    for (auto it = waiting.begin(); it != waiting.end(); ++it) {
      if (address != nullptr && it->address != *address) continue;
      auto victim = it->session.lock();
      waiting.erase(it);
      if (!victim) return false;
      victim->in_waiting = false;
      victim->release();  // its slot is free now, not when its handler has run
      victim->close();
      ++evicted;
      return true;
    }
    return false;
  }

  void accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (!ec) {
        beast::error_code aec;
        const auto remote = socket.remote_endpoint(aec);
        const std::string address = aec ? std::string("?") : remote.address().to_string();
        bool room = true;
        if (per_address[address] >= kMaxPerAddress) room = evict_oldest(&address);
        if (room && connections >= kMaxConnections) room = evict_oldest(nullptr);
        if (room) {
          std::make_shared<Session>(*this, std::move(socket), address)->start();
        } else {
          if (per_address[address] == 0) per_address.erase(address);
          beast::error_code ignored;
          socket.close(ignored);  // every slot is serving a request: they end within 5 s
        }
      }
      if (acceptor.is_open()) accept();
    });
  }

  http::response<http::string_body> respond(const http::request<http::empty_body>& req) const {
    http::response<http::string_body> res;
    res.version(req.version());
    res.set(http::field::server, "xloco");
    res.keep_alive(false);
    const auto text = [&](http::status code, const std::string& body) {
      res.result(code);
      res.set(http::field::content_type, "text/plain");
      res.body() = body;
    };
    const std::string full_target(req.target());
    const auto query_at = full_target.find('?');
    const std::string target = full_target.substr(0, query_at);
    const std::string query = query_at == std::string::npos ? "" : full_target.substr(query_at + 1);
    const bool authenticated = !token.empty() && equal_secret(bearer(req), token);
    const auto snapshot = [this] {
      std::lock_guard<std::mutex> lock(mu);
      return status;
    };
    const auto json_body = [&](std::string body) {
      res.result(http::status::ok);
      res.set(http::field::content_type, "application/json");
      res.set(http::field::cache_control, "no-store");
      res.body() = std::move(body);
    };
    if (req.method() != http::verb::get) {
      text(http::status::method_not_allowed, "only GET\n");
    } else if (target == "/" || target == "/index.html") {
      page(res);
    } else if (refused(req, authenticated, res)) {
    } else if (target == "/history") {
      if (const auto since = parse_history_query(query); !since) {
        text(http::status::bad_request,
             "/history takes ?since=ROUND (a round number; no query for the whole run), not ?" +
                 query.substr(0, 64) + "\n");
      } else {
        json_body(history_since(*since));
      }
    } else if (target == "/run") {
      std::lock_guard<std::mutex> lock(mu);
      json_body(run_json);
    } else if (target == "/status") {
      HeadStatus now = snapshot();
      if (!authenticated) {
        for (auto& p : now.providers) p.address.clear();  // addresses for the token's holders
      }
      json_body(common::json_dump(json(now), 2) + "\n");
    } else if (target == "/metrics") {
      res.result(http::status::ok);
      res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      res.body() = prometheus_text(snapshot());
    } else {
      text(http::status::not_found, "not found: try /, /status, /history, /run or /metrics\n");
    }
    res.prepare_payload();
    return res;
  }

  // Whether the request may not read the run's data, with the refusal written to `res`.
  bool refused(const http::request<http::empty_body>& req, bool authenticated,
               http::response<http::string_body>& res) const {
    if (authenticated) return false;
    if (!open_bind && !loopback_host_header(req)) {
      // A loopback port answers only requests addressed to loopback: a page from elsewhere
      // whose name was rebound to 127.0.0.1 cannot read it (the token's holders may).
      res.result(http::status::forbidden);
      res.set(http::field::content_type, "text/plain");
      res.body() = "this status port serves loopback names only (Host: 127.0.0.1, localhost)\n";
      return true;
    }
    if (open_bind) {
      res.result(http::status::unauthorized);
      res.set(http::field::content_type, "text/plain");
      res.body() = "send Authorization: Bearer TOKEN (the head's --http-token / XLOCO_HTTP_TOKEN)\n";
      res.set(http::field::www_authenticate, "Bearer");
      return true;
    }
    return false;
  }

  // The page holds no data (it fetches the rest with the token from its URL's fragment), so it
  // is served to anyone; nothing it loads comes from elsewhere.
  static void page(http::response<http::string_body>& res) {
    res.result(http::status::ok);
    res.set(http::field::content_type, "text/html; charset=utf-8");
    res.set(http::field::cache_control, "no-store");
    res.set("Content-Security-Policy",
            "default-src 'none'; connect-src 'self'; img-src 'self' data:; "
            "style-src 'unsafe-inline'; script-src 'unsafe-inline'");
    res.body() = dashboard_page();
  }

  // The token an Authorization: Bearer header presents ("" for none).
  static std::string bearer(const http::request<http::empty_body>& req) {
    const auto it = req.find(http::field::authorization);
    if (it == req.end()) return "";
    const std::string value(it->value());
    return value.rfind("Bearer ", 0) == 0 ? value.substr(7) : "";
  }

  // /history's body: the rounds after `since`, and the epoch that says whether they continue
  // what the page holds.
  std::string history_since(uint64_t since) const {
    json rounds = json::array();
    std::string epoch;
    {
      std::lock_guard<std::mutex> lock(mu);
      const auto from = std::upper_bound(history.begin(), history.end(), since,
                                         [](uint64_t r, const HistoryPoint& h) { return r < h.round; });
      for (auto it = from; it != history.end(); ++it) rounds.push_back(*it);
      epoch = instance + "-" + std::to_string(replaced);
    }
    return common::json_dump(json{{"epoch", epoch}, {"rounds", std::move(rounds)}}) + "\n";
  }

  static bool loopback_host_header(const http::request<http::empty_body>& req) {
    const auto it = req.find(http::field::host);
    if (it == req.end()) return true;  // HTTP/1.0 clients send none; browsers always do
    std::string host(it->value());  // HOST[:PORT], HOST an IPv6 address in brackets
    if (!host.empty() && host.front() == '[') {
      host = host.substr(1, host.find(']') - 1);  // npos − 1: the rest, for a malformed one
    } else if (const auto colon = host.rfind(':'); colon != std::string::npos) {
      host.resize(colon);
    }
    return is_loopback_host(host);
  }

  struct Session : std::enable_shared_from_this<Session> {
    Impl& server;
    beast::tcp_stream stream;
    beast::flat_buffer buffer;
    http::request_parser<http::empty_body> parser;
    http::response<http::string_body> res;
    std::string address;
    bool in_waiting = false;
    std::list<Waiting>::iterator waiting_at;

    Session(Impl& s, tcp::socket socket, std::string addr)
        : server(s), stream(std::move(socket)), address(std::move(addr)) {
      ++server.connections;
      ++server.per_address[address];
    }
    bool counted = true;
    ~Session() {
      leave_waiting();
      release();
    }
    void release() {
      if (!counted) return;
      counted = false;
      --server.connections;
      if (--server.per_address[address] <= 0) server.per_address.erase(address);
    }
    void leave_waiting() {
      if (in_waiting) server.waiting.erase(waiting_at);
      in_waiting = false;
    }

    void start() {
      parser.header_limit(16 * 1024);
      waiting_at = server.waiting.insert(server.waiting.end(), {shared_from_this(), address});
      in_waiting = true;
      stream.expires_after(kHeaderDeadline);  // the request's headers
      http::async_read(stream, buffer, parser,
                       [self = shared_from_this()](beast::error_code ec, std::size_t) {
                         self->leave_waiting();
                         if (ec) return self->close();
                         self->stream.expires_after(kDeadline);  // the answer
                         self->res = self->server.respond(self->parser.get());
                         http::async_write(self->stream, self->res,
                                           [self](beast::error_code, std::size_t) { self->close(); });
                       });
    }
    void close() {
      beast::error_code ec;
      stream.socket().shutdown(tcp::socket::shutdown_both, ec);
      stream.close();
    }
  };
};

StatusServer::StatusServer(const std::string& bind, const std::string& token)
    : impl_(std::make_unique<Impl>()) {
  const auto [host, port] = split_host_port(bind, "--http");
  impl_->open_bind = !is_loopback_host(host);
  impl_->token = token;
  XLOCO_ENFORCE(!impl_->open_bind || !token.empty(), common::ConfigError,
                "--http {} serves beyond this machine: set a bearer token with --http-token or "
                "XLOCO_HTTP_TOKEN (clients send `Authorization: Bearer TOKEN`; xloco status "
                "takes the same option), or bind 127.0.0.1",
                bind);
  XLOCO_ENFORCE(token.empty() || token.size() >= 16, common::ConfigError,
                "--http-token: {} characters is too short to guess-proof; use 16 or more (e.g. "
                "`openssl rand -hex 16`)",
                token.size());
  try {
    tcp::resolver resolver(impl_->ioc);
    const auto endpoint = *resolver.resolve(host, port, tcp::resolver::passive).begin();
    impl_->acceptor.open(endpoint.endpoint().protocol());
    impl_->acceptor.set_option(tcp::acceptor::reuse_address(true));
    impl_->acceptor.bind(endpoint);
    impl_->acceptor.listen();
  } catch (const std::exception& e) {
    throw common::ConfigError(fmt::format("--http {}: cannot listen: {}", bind, e.what()));
  }
  impl_->host = host == "0.0.0.0" ? "127.0.0.1" : host;
  impl_->accept();
  impl_->thread = std::thread([this] { impl_->ioc.run(); });
}

StatusServer::~StatusServer() {
  impl_->ioc.stop();  // no handler runs after this; open connections close with the context
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::unique_ptr<StatusServer> StatusServer::start(const std::string& bind, const std::string& run_dir,
                                                  const std::string& token) {
  auto server = std::make_unique<StatusServer>(bind, token);
  const std::string url = server->url();
  try {
    common::write_file_atomic(run_dir + "/status.url", url + "\n");
  } catch (const common::Error& e) {
    spdlog::warn("status: {} (xloco status --run will not find the URL)", e.what());
  }
  spdlog::info("status: {}/ (the dashboard; beyond loopback {}/#token=TOKEN), {}/status and "
               "{}/metrics (xloco status --head {})", url, url, url, url, url);
  return server;
}

void StatusServer::publish(HeadStatus status) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->status = std::move(status);
}

void StatusServer::set_run(RunInfo info) {
  std::string body = common::json_dump(json(info)) + "\n";
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->run_json = std::move(body);
}

void StatusServer::add_round(const RoundRecord& record) {
  HistoryPoint point = history_point(record);
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& h = impl_->history;
  // Rounds come in order; a head that resumed from an older checkpoint records some again.
  while (!h.empty() && h.back().round >= point.round) {
    h.pop_back();
    ++impl_->replaced;
  }
  h.push_back(std::move(point));
}

std::string StatusServer::url() const {
  return fmt::format("http://{}:{}", impl_->host, impl_->acceptor.local_endpoint().port());
}

namespace {

// The run's own metrics: rounds, bytes, refusals, failures.
void run_metrics(const HeadStatus& s, std::string& out) {
  const auto metric = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  const auto sample = [&](const char* name, double value) {
    out += fmt::format("{}{{run=\"{}\"}} {}\n", name, escape_label(s.run), value);
  };
  metric("xloco_rounds_completed", "gauge", "Outer rounds completed (committed) so far.");
  sample("xloco_rounds_completed", static_cast<double>(s.round));
  metric("xloco_rounds_planned", "gauge", "Outer rounds the run will take in all.");
  sample("xloco_rounds_planned", s.total_rounds);
  metric("xloco_paused", "gauge", "1 while the head waits for enough live providers.");
  sample("xloco_paused", s.state == "paused" ? 1 : 0);
  if (s.eval_loss) {
    metric("xloco_eval_loss", "gauge", "Validation loss of theta_pub at its last evaluation.");
    sample("xloco_eval_loss", *s.eval_loss);
  }
  metric("xloco_round_deadline_seconds", "gauge", "Deadline of the round in progress.");
  sample("xloco_round_deadline_seconds", s.deadline_s);
  metric("xloco_bytes_up_total", "counter", "Contribution bytes received by the head.");
  sample("xloco_bytes_up_total", s.bytes_up);
  metric("xloco_bytes_down_total", "counter", "Update and state bytes sent by the head.");
  sample("xloco_bytes_down_total", s.bytes_down);
  metric("xloco_late_contributions_total", "counter",
         "Contributions dropped because their round had closed.");
  sample("xloco_late_contributions_total", static_cast<double>(s.late_contributions));
  metric("xloco_refused_total", "counter",
         "Messages the head refused, by reason (its wire code: bad_tokens, bad_frame, outlier, ...).");
  for (const auto& [code, n] : s.refused) {
    out += fmt::format("xloco_refused_total{{run=\"{}\",code=\"{}\"}} {}\n", escape_label(s.run),
                       escape_label(code), n);
  }
  metric("xloco_discarded_rounds_total", "counter",
         "Rounds whose outer step would have made theta non-finite (not applied).");
  sample("xloco_discarded_rounds_total", static_cast<double>(s.discarded_rounds));
  metric("xloco_checkpoint_failures_total", "counter", "Head checkpoints that could not be written.");
  sample("xloco_checkpoint_failures_total", static_cast<double>(s.checkpoint_failures));
  metric("xloco_write_failures_total", "counter", "Metrics lines that could not be written (retried).");
  sample("xloco_write_failures_total", static_cast<double>(s.write_failures));
  metric("xloco_last_checkpoint_round", "gauge", "Round of the newest checkpoint this head wrote.");
  sample("xloco_last_checkpoint_round", static_cast<double>(s.last_checkpoint));
}

// The providers' metrics: by state, and one sample per provider of each.
void provider_metrics(const HeadStatus& s, std::string& out) {
  const auto metric = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  metric("xloco_providers", "gauge", "Providers known to the head, by state.");
  for (const char* state : {"joining", "active", "straggling", "dead", "left"}) {
    const auto n = std::count_if(s.providers.begin(), s.providers.end(),
                                 [&](const ProviderStatus& p) { return p.state == state; });
    out += fmt::format("xloco_providers{{run=\"{}\",state=\"{}\"}} {}\n", escape_label(s.run), state, n);
  }
  const auto per_provider = [&](const char* name, const char* type, const char* help,
                                double (*value)(const ProviderStatus&)) {
    if (s.providers.empty()) return;
    metric(name, type, help);
    for (const auto& p : s.providers) {
      out += fmt::format("{}{{run=\"{}\",provider=\"{}\"}} {}\n", name, escape_label(s.run),
                         escape_label(p.name), value(p));
    }
  };
  using P = const ProviderStatus&;
  per_provider("xloco_provider_up", "gauge", "1 while the provider is live (joining, active or straggling).", [](P p) { return double(p.up); });
  per_provider("xloco_provider_last_round", "gauge", "Last round the provider contributed to.", [](P p) { return double(p.last_round); });
  per_provider("xloco_provider_tokens_per_second", "gauge", "The provider's recent inner throughput.", [](P p) { return p.tokens_per_s; });
  per_provider("xloco_provider_tokens_total", "counter", "Tokens in the provider's counted contributions.", [](P p) { return double(p.tokens); });
  per_provider("xloco_provider_bytes_up_total", "counter", "Contribution bytes from the provider.", [](P p) { return p.bytes_up; });
  per_provider("xloco_provider_bytes_down_total", "counter", "Bytes sent to the provider.", [](P p) { return p.bytes_down; });
  per_provider("xloco_provider_last_seen_seconds", "gauge", "Seconds since the provider was last heard from.", [](P p) { return p.last_seen_s; });
  if (std::any_of(s.providers.begin(), s.providers.end(), [](P p) { return p.score.has_value(); })) {
    metric("xloco_provider_score", "gauge",
           "outer.score: the loss change the provider's last scored contribution caused alone (negative: it helped).");
    for (const auto& p : s.providers) {
      if (!p.score) continue;
      out += fmt::format("xloco_provider_score{{run=\"{}\",provider=\"{}\"}} {}\n", escape_label(s.run),
                         escape_label(p.name),
                         std::isfinite(*p.score) ? fmt::format("{}", *p.score) : std::string("NaN"));
    }
  }
}

}  // namespace

std::string prometheus_text(const HeadStatus& s) {
  std::string out;
  run_metrics(s, out);
  provider_metrics(s, out);
  return out;
}

std::optional<uint64_t> parse_history_query(const std::string& query) {
  if (query.empty()) return uint64_t{0};
  constexpr std::string_view kKey = "since=";
  if (query.size() <= kKey.size() || query.compare(0, kKey.size(), kKey) != 0) return std::nullopt;
  uint64_t since = 0;
  const char* first = query.data() + kKey.size();
  const char* last = query.data() + query.size();
  const auto [end, ec] = std::from_chars(first, last, since);
  if (ec != std::errc() || end != last) return std::nullopt;
  return since;
}

std::string http_get(const std::string& base, const std::string& path, double timeout_s,
                     const std::string& token) {
  std::string rest = base;
  rest.erase(0, rest.find_first_not_of(" \t\r\n"));
  rest.erase(rest.find_last_not_of(" \t\r\n/") + 1);
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  XLOCO_ENFORCE(rest.find("://") == std::string::npos, common::ConfigError,
                "{}: only http:// status URLs are served by the head", base);
  if (const auto slash = rest.find('/'); slash != std::string::npos) rest = rest.substr(0, slash);
  const auto [host, port] = split_host_port(rest, "status URL");
  try {
    asio::io_context ioc;
    tcp::resolver resolver(ioc);
    tcp::socket socket(ioc);
    asio::connect(socket, resolver.resolve(host, port));
    set_timeouts(socket.native_handle(), timeout_s);
    http::request<http::empty_body> req{http::verb::get, path, 11};
    req.set(http::field::host, host);
    req.set(http::field::user_agent, "xloco status");
    if (!token.empty()) req.set(http::field::authorization, "Bearer " + token);
    http::write(socket, req);
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64u << 20);
    http::read(socket, buffer, parser);
    const auto& res = parser.get();
    XLOCO_ENFORCE(res.result() == http::status::ok, common::Error, "GET {}{}: HTTP {}", base,
                  path, res.result_int());
    return res.body();
  } catch (const common::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw common::Error(fmt::format("GET {}{}: {}", base, path, e.what()));
  }
}

std::string status_table(const HeadStatus& s) {
  std::string out = fmt::format("run {} | round {}/{} | {}{} | eval {} | {} up, {} down\n", s.run,
                                s.round, s.total_rounds, s.state,
                                s.reason.empty() ? "" : " (" + s.reason + ")",
                                s.eval_loss ? fmt::format("{:.4f}", *s.eval_loss) : "-",
                                common::human_bytes(s.bytes_up), common::human_bytes(s.bytes_down));
  if (!s.advice.empty()) out += "advice: " + s.advice + "\n";
  std::string trouble;
  for (const auto& [code, n] : s.refused) trouble += fmt::format("{}{} {}", trouble.empty() ? "" : ", ", n, code);
  if (!trouble.empty()) out += "refused: " + trouble + "\n";
  if (s.discarded_rounds > 0) out += fmt::format("discarded rounds (non-finite outer step): {}\n", s.discarded_rounds);
  if (s.checkpoint_failures > 0 || s.write_failures > 0) {
    out += fmt::format("failed writes: {} checkpoints, {} metrics lines; last checkpoint round {}; {}\n",
                       s.checkpoint_failures, s.write_failures, s.last_checkpoint, s.last_error);
  }
  out += fmt::format("{:<20} {:<15} {:<11} {:>6} {:>11} {:>11} {:>11} {:>9}  {}\n", "PROVIDER",
                     "ADDRESS", "STATE", "ROUND", "TOKENS/S", "BYTES UP", "BYTES DOWN", "SEEN",
                     "REASON");
  for (const auto& p : s.providers) {
    out += fmt::format("{:<20} {:<15} {:<11} {:>6} {:>11} {:>11} {:>11} {:>8.1f}s  {}\n", p.name,
                       p.address.empty() ? "-" : p.address, p.state, p.last_round,
                       common::human_rate(p.tokens_per_s), common::human_bytes(p.bytes_up),
                       common::human_bytes(p.bytes_down), p.last_seen_s, p.reason);
  }
  return out;
}

}  // namespace xloco::outer
