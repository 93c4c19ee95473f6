// `xloco status --head URL`: the head's providers as a table (state, last round, tokens/s,
// bytes, last seen), as `ray status` prints a cluster. --run DIR finds the URL a head wrote.
#include <filesystem>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/error.h"
#include "outer/status_http.h"

namespace xloco::cli {
namespace fs = std::filesystem;

void add_status_command(CLI::App& app) {
  struct Args {
    std::string head, run, token;
    bool json = false, metrics = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("status", "show a running head's providers and rounds");
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
