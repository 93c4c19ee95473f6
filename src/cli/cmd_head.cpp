// `xloco head`: the coordinator of a DiLoCo run. Binds (--bind) and tells providers where to
// connect (--advertise: on Akash the public port differs from the bound one), admits only the
// allow-listed provider keys, and prints the exact `xloco worker` line that joins it.
#include <filesystem>
#include <fstream>

#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "cli/launch.h"
#include "common/alloc.h"
#include "common/config.h"
#include "common/error.h"
#include "common/safetensors.h"
#include "common/text.h"
#include "inner/data.h"
#include "inner/runtime.h"
#include "net/keys.h"
#include "net/zmq/transport.h"
#include "outer/head/head.h"
#include "outer/status/status_http.h"

namespace xloco::cli {
namespace fs = std::filesystem;

namespace {

struct Args {
  std::string config, bind, advertise, key, init, endpoint_file, http, http_token, baseline;
  std::vector<std::string> overrides, allow;
  bool insecure = false, resume = false, auto_resume = false;
};

// The `xloco worker` line that joins this head, safe to paste into a shell (every word quoted
// where it must be: Z85 keys hold & < > $ !). It repeats the head's --set overrides that change
// the config hash (a provider without them would be refused) and run.name (messages carry it);
// the others (the head's own: run.dir, timeouts, norm rules, data.path) are named on a line of
// their own.
std::string join_line(const Args& a, const common::Config& cfg, const std::string& advertise,
                      const std::string& head_pub) {
  const std::string hash = common::config_hash(cfg);
  std::string line = "xloco worker --config " + common::shell_quote(a.config) + " --head " +
                     common::shell_quote(advertise);
  line += a.insecure ? " --insecure" : " --head-pub " + common::shell_quote(head_pub);
  std::vector<std::string> own;
  for (size_t i = 0; i < a.overrides.size(); ++i) {
    auto others = a.overrides;
    others.erase(others.begin() + static_cast<std::ptrdiff_t>(i));
    // run.name is not hashed but every message carries it; one whose absence leaves a config
    // that does not load is repeated too.
    bool agreed = a.overrides[i].rfind("run.name=", 0) == 0;
    try {
      agreed = agreed || common::config_hash(inner::load_run_config(a.config, others)) != hash;
    } catch (const common::Error&) {
      agreed = true;
    }
    if (agreed) {
      line += " --set " + common::shell_quote(a.overrides[i]);
    } else {
      own.push_back(a.overrides[i]);
    }
  }
  line += " --key PROVIDER.key";
  std::string out = "join with:\n  " + line + "\n";
  if (!own.empty()) {
    std::string words;
    for (const auto& o : own) words += " " + common::shell_quote(o);
    out += "  (not repeated: the head's alone, or each machine's own, as run.dir and data.path "
           "are; set yours where they differ:" + words + ")\n";
  }
  return out;
}

}  // namespace

void add_head_command(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("head", "coordinate a DiLoCo run across providers");
  cmd->add_option("--config", a->config, "JSON run config")->required()->check(CLI::ExistingFile)->envname("XLOCO_CONFIG");
  cmd->add_option("--set", a->overrides, "override a config value, e.g. --set outer.lr=0.7")->envname("XLOCO_SET")->delimiter(',');
  cmd->add_option("--bind", a->bind, "ZeroMQ endpoint to bind (port 0 picks a free one; default tcp://0.0.0.0:7700, tcp://127.0.0.1:7700 with --insecure)")->envname("XLOCO_BIND");
  cmd->add_option("--advertise", a->advertise, "tcp://HOST:PORT providers connect to (default: the bound endpoint)")->envname("XLOCO_ADVERTISE");
  cmd->add_option("--key", a->key, "the head's secret key: a file (xloco keygen) or its Z85 text")->envname("XLOCO_KEY");
  cmd->add_option("--allow", a->allow, "allow-listed provider keys: .pub files, directories of them, or NAME=Z85KEY")->envname("XLOCO_ALLOW")->delimiter(',');
  cmd->add_flag("--insecure", a->insecure, "plaintext, unauthenticated links (loopback experiments only)")->envname("XLOCO_INSECURE");
  cmd->add_flag("--resume", a->resume, "continue from the run's latest checkpoint")->envname("XLOCO_RESUME");
  cmd->add_flag("--auto-resume", a->auto_resume,
                "continue from the latest checkpoint if the run has one, else start it (for "
                "containers that restart)")
      ->envname("XLOCO_AUTO_RESUME")
      ->excludes("--resume");
  cmd->add_option("--init", a->init, "warm start θ from an xloco checkpoint directory, a Hugging Face GPT-2 directory or a nanoGPT-named .safetensors file")->envname("XLOCO_INIT");
  cmd->add_option("--endpoint-file", a->endpoint_file, "write the bound endpoint here once listening")->envname("XLOCO_ENDPOINT_FILE");
  cmd->add_option("--http", a->http,
                  "serve the dashboard (GET /), /status, /history, /run and /metrics on HOST:PORT "
                  "(HOST defaults to 127.0.0.1; port 0 picks a free one; the URL goes to "
                  "runs/NAME/status.url)")
      ->envname("XLOCO_HTTP");
  cmd->add_option("--baseline", a->baseline,
                  "draw this single-cluster run's eval curve beside the run's on the dashboard: "
                  "the metrics JSONL of an `xloco train` run (runs/NAME/metrics/provider-0.jsonl)")
      ->check(CLI::ExistingFile)
      ->envname("XLOCO_BASELINE");
  cmd->add_option("--http-token", a->http_token,
                  "bearer token for the status endpoint, required when --http binds beyond "
                  "loopback; only its holders see provider addresses")
      ->envname("XLOCO_HTTP_TOKEN");
  cmd->callback([a]() {
    const auto cfg = inner::load_run_config(a->config, a->overrides);
    common::check_diloco_schedule(cfg);
    common::set_alloc_policy(common::AllocPolicy::kHead);
    // Under xloco local the head shares the cores with every rank: its BLAS threads must not
    // spin against theirs (XLOCO_RANKS_ON_HOST counts the ranks on this machine).
    inner::configure_threads(cfg.run, ranks_on_host(1));
    net::zeromq::ServerOptions so;
    so.bind = !a->bind.empty() ? a->bind : a->insecure ? "tcp://127.0.0.1:7700" : "tcp://0.0.0.0:7700";
    so.link.insecure = a->insecure;
    if (a->insecure && so.bind.rfind("tcp://", 0) == 0) {
      const std::string host = outer::split_host_port(so.bind.substr(6), "head --bind").first;
      XLOCO_ENFORCE(outer::is_loopback_host(host),
                    common::ConfigError,
                    "head: --insecure links are plaintext and unauthenticated: they bind only a "
                    "loopback address, not {} (use keys for anything else)",
                    so.bind);
    }
    warn_if_in_argv(a->key, "--key", "XLOCO_KEY");
    warn_if_in_argv(a->http_token, "--http-token", "XLOCO_HTTP_TOKEN");
    std::string head_pub;
    if (!a->insecure) {
      XLOCO_ENFORCE(!a->key.empty(), common::ConfigError,
                    "head: --key FILE is required (make one with `xloco keygen head`), or pass "
                    "--insecure for a plaintext loopback run");
      XLOCO_ENFORCE(!a->allow.empty(), common::ConfigError,
                    "head: --allow is required: the providers' .pub files or a directory of them");
      so.key = net::keypair_from(a->key, "head --key / XLOCO_KEY");
      so.allow = net::AllowList::parse(a->allow);
      head_pub = so.key.public_key;
    }
    auto server = std::make_unique<net::zeromq::Server>(so);
    const std::string endpoint = server->endpoint();
    const std::string advertise = a->advertise.empty() ? endpoint : a->advertise;
    const fs::path run_dir = fs::path(cfg.run.dir) / cfg.run.name;
    fs::create_directories(run_dir);
    common::write_file_atomic((run_dir / "config.json").string(), common::to_json_string(cfg) + "\n");
    spdlog::info("head listening on {} ({} allow-listed providers)", endpoint,
                 a->insecure ? 0 : so.allow.size());
    fmt::print("{}", join_line(*a, cfg, advertise, head_pub));
    std::fflush(stdout);
    if (!a->endpoint_file.empty()) common::write_file_atomic(a->endpoint_file, endpoint + "\n");
    outer::HeadOptions ho;
    ho.run_dir = run_dir.string();
    ho.resume = a->resume;
    ho.auto_resume = a->auto_resume;
    ho.init = a->init;
    ho.http = a->http;
    ho.http_token = a->http_token;
    ho.baseline = a->baseline;
    outer::Head head(cfg, ho, std::move(server));
    const int rc = head.run();
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace xloco::cli
