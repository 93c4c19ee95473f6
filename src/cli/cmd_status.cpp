// `xloco status --head URL`: the head's providers as a table (state, last round, tokens/s,
// bytes, last seen), as `ray status` prints a cluster. --run DIR finds the URL a head wrote.
#include <filesystem>
#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/error.h"
#include "outer/status/status_http.h"

namespace xloco::cli {
namespace fs = std::filesystem;

namespace {

// A run has ended when its head wrote summary.json after its last status.url (a head that
// starts again, --resume, writes status.url anew).
bool run_has_ended(const fs::path& run) {
  std::error_code ec;
  const auto summary = fs::last_write_time(run / "summary.json", ec);
  if (ec) return false;
  const auto url = fs::last_write_time(run / "status.url", ec);
  return ec || summary >= url;
}

}  // namespace

void add_status_command(CLI::App& app) {
  struct Args {
    std::string head, run, token;
    bool json = false, metrics = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "status", "show a running head's providers and rounds (or, --run, a finished run's summary)");
  cmd->add_option("--head", a->head, "the head's status URL, http://HOST:PORT (its --http)")->envname("XLOCO_STATUS");
  cmd->add_option("--run", a->run, "a run directory (runs/NAME) whose head wrote status.url");
  cmd->add_option("--http-token", a->token, "the head's --http-token (needed beyond loopback; shows provider addresses)")->envname("XLOCO_HTTP_TOKEN");
  cmd->add_flag("--json", a->json, "print the raw /status JSON");
  cmd->add_flag("--metrics", a->metrics, "print the raw /metrics (Prometheus text)");
  cmd->callback([a]() {
    warn_if_in_argv(a->token, "--http-token", "XLOCO_HTTP_TOKEN");
    std::string url = a->head;
    if (url.empty()) {
      XLOCO_ENFORCE(!a->run.empty(), common::ConfigError,
                    "status: pass --head http://HOST:PORT or --run runs/NAME");
      if (run_has_ended(a->run)) {
        const fs::path summary = fs::path(a->run) / "summary.json";
        XLOCO_ENFORCE(!a->metrics, common::IoError,
                      "status: the run in {} has ended (its summary.json is newer than its "
                      "status.url): no head serves /metrics; its metrics are in {}",
                      a->run, (fs::path(a->run) / "metrics").string());
        if (a->json) {
          std::ifstream in(summary);
          std::cout << in.rdbuf();
          return;
        }
        fmt::print("the run has ended; its summary ({}):\n", summary.string());
        print_summary(fs::path(a->run));
        return;
      }
      const fs::path file = fs::path(a->run) / "status.url";
      std::ifstream in(file);
      XLOCO_ENFORCE(in && (in >> url), common::IoError,
                    "status: {} not found: was the head started with --http?", file.string());
    }
    if (a->metrics) {
      std::cout << outer::http_get(url, "/metrics", 5, a->token);
      return;
    }
    const auto body = outer::http_get(url, "/status", 5, a->token);
    if (a->json) {
      std::cout << body;
      return;
    }
    const auto doc = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    XLOCO_ENFORCE(doc.is_object(), common::IoError, "status: {}/status did not answer JSON", url);
    std::cout << outer::status_table(doc.get<outer::HeadStatus>());
  });
}

}  // namespace xloco::cli
