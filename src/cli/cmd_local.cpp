// `xloco local`: a whole DiLoCo run on one machine — a head and K providers × R ranks as child
// processes on loopback, with fresh CURVE keys in the run directory. Ctrl+C stops and reaps
// every child. At the end it prints the run's summary.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "common/config.h"
#include "common/error.h"
#include "common/metrics.h"
#include "common/process.h"
#include "inner/data.h"
#include "net/keys.h"
#include "outer/status/documents.h"

namespace xloco::cli {
namespace fs = std::filesystem;

namespace {

struct LocalArgs {
  std::string config, init, http = "127.0.0.1:0", baseline, http_token;
  std::vector<std::string> overrides;
  std::vector<int> start_order;  // provider indices in the order they start; empty: 0..K-1
  int providers = 0, nproc = 1;
  bool insecure = false, resume = false;
};

// The order the providers start in: --start-order (a permutation of 0..K-1, each started half
// a second after the one before, so that they connect in that order) or 0..K-1 at once.
std::vector<int> start_order(const LocalArgs& a, int providers) {
  if (a.start_order.empty()) {
    std::vector<int> order(static_cast<size_t>(providers));
    for (int i = 0; i < providers; ++i) order[static_cast<size_t>(i)] = i;
    return order;
  }
  std::vector<int> sorted = a.start_order;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < providers; ++i) {
    XLOCO_ENFORCE(sorted.size() == static_cast<size_t>(providers) && sorted[static_cast<size_t>(i)] == i,
                  common::ConfigError, "local: --start-order {} is not a permutation of 0..{}",
                  fmt::join(a.start_order, ","), providers - 1);
  }
  return a.start_order;
}

std::vector<std::string> with_overrides(std::vector<std::string> argv, const LocalArgs& a) {
  argv.insert(argv.end(), {"--config", a.config});
  for (const auto& o : a.overrides) argv.insert(argv.end(), {"--set", o});
  return argv;
}

std::string wait_for_endpoint(const fs::path& file, pid_t head) {
  for (int i = 0; i < 1200; ++i) {
    std::ifstream in(file);
    std::string ep;
    if (in >> ep && !ep.empty()) return ep;
    XLOCO_ENFORCE(::waitpid(head, nullptr, WNOHANG) == 0, common::Error,
                  "the head exited before listening; see its log above");
    XLOCO_ENFORCE(common::pending_signal() == 0, common::Error, "interrupted");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  throw common::Error("the head did not report its endpoint within 120 s");
}

}  // namespace

void print_summary(const fs::path& run_dir, double wall) {
  outer::RunSummary s;
  try {
    s = outer::read_document<outer::RunSummary>((run_dir / "summary.json").string());
  } catch (const common::IoError& e) {
    fmt::print("no summary written (see the logs above): {}\n", e.what());
    return;
  }
  fmt::print(
      "\n== xloco run {}\n"
      "final eval loss      {:.4f}\n"
      "rounds               {}\n"
      "bytes up / down      {} / {}\n"
      "vs fp32 data parallel {:.5f}x the bytes ({:.0f}x fewer)\n"
      "wall time            {}\n"
      "checkpoint           {}\n",
      run_dir.string(), s.final_eval_loss, s.rounds, common::human_bytes(s.bytes_up),
      common::human_bytes(s.bytes_down), s.bytes_vs_fp32_dp, 1.0 / std::max(1e-12, s.bytes_vs_fp32_dp),
      common::human_duration(wall >= 0 ? wall : s.wall_s), (run_dir / "ckpt").string());
}

namespace {

// provider-i's command line: shard i, its own key.
std::vector<std::string> worker_argv(const LocalArgs& a, int i, const std::string& endpoint,
                                     const fs::path& keys) {
  const std::string name = fmt::format("provider-{}", i);
  auto argv = with_overrides({common::self_exe(), "worker"}, a);
  argv.insert(argv.end(), {"--head", endpoint, "--name", name, "--nproc", std::to_string(a.nproc),
                           "--shard", std::to_string(i)});
  if (!a.init.empty()) argv.insert(argv.end(), {"--init", a.init});  // no state to download
  if (a.insecure) {
    argv.push_back("--insecure");
  } else {
    argv.insert(argv.end(), {"--head-pub", (keys / "head.pub").string(), "--key",
                             (keys / (name + ".key")).string()});
  }
  return argv;
}

// How `xloco local` ends when its head did not finish the run (pure: the children's exits, head
// first). Every provider failing makes wait_children stop the head, which then exits 130 as if
// interrupted: that is the providers' failure, not an interruption, and resuming would only
// fail again. {0, ""} when the head finished.
struct LocalExit {
  int code = 0;
  std::string message;
};
LocalExit local_exit(const std::vector<common::ChildResult>& results) {
  if (results.empty() || results.front().exit_code == 0) return {};
  const auto& head = results.front();
  std::vector<std::string> failed;
  int first_code = 1;
  for (size_t i = 1; i < results.size(); ++i) {
    const auto& r = results[i];
    if (r.exit_code == 0 || r.exit_code == 130) continue;
    if (failed.empty()) first_code = r.exit_code;
    failed.push_back(fmt::format("{} (code {})", r.label, r.exit_code));
  }
  if (!failed.empty() && failed.size() + 1 == results.size()) {
    return {first_code,
            fmt::format("every provider failed: {}; the head was stopped (its checkpoint is "
                        "kept). Their errors are in the log above; fix the cause, then start "
                        "again (`--resume` continues from the checkpoint).",
                        fmt::join(failed, ", "))};
  }
  if (head.exit_code == 130) {
    return {130, fmt::format("{} was interrupted; resume with `xloco local --resume` and the same "
                             "config.", head.label)};
  }
  return {head.exit_code, fmt::format("{} exited with code {}; its error is in the log above{}",
                                      head.label, head.exit_code,
                                      failed.empty() ? std::string()
                                                     : fmt::format(" (also failed: {})",
                                                                   fmt::join(failed, ", ")))};
}

int run_local(const LocalArgs& in) {
  LocalArgs a = in;
  if (a.providers > 0) a.overrides.push_back(fmt::format("outer.providers={}", a.providers));
  const auto cfg = inner::load_run_config(a.config, a.overrides);
  common::check_diloco_schedule(cfg);
  const int K = cfg.outer.providers;
  const fs::path run_dir = fs::path(cfg.run.dir) / cfg.run.name;
  const fs::path keys = run_dir / "keys";
  fs::remove_all(keys);
  fs::create_directories(keys / "allow");
  fs::remove(run_dir / "head.endpoint");
  fs::remove(run_dir / "summary.json");
  const std::string exe = common::self_exe();
  std::vector<std::string> head_argv = with_overrides({exe, "head"}, a);
  head_argv.insert(head_argv.end(), {"--bind", "tcp://127.0.0.1:0", "--endpoint-file",
                                     (run_dir / "head.endpoint").string(), "--http",
                                     a.http});
  if (!a.baseline.empty()) head_argv.insert(head_argv.end(), {"--baseline", a.baseline});
  if (a.resume) head_argv.push_back("--resume");
  if (!a.init.empty()) head_argv.insert(head_argv.end(), {"--init", a.init});
  if (a.insecure) {
    head_argv.push_back("--insecure");
  } else {
    net::write_keypair(keys / "head", net::generate_keypair());
    for (int i = 0; i < K; ++i) {
      const auto pair = net::generate_keypair();
      net::write_keypair(keys / fmt::format("provider-{}", i), pair);
      std::ofstream(keys / "allow" / fmt::format("provider-{}.pub", i)) << pair.public_key << "\n";
    }
    head_argv.insert(head_argv.end(), {"--key", (keys / "head.key").string(), "--allow",
                                       (keys / "allow").string()});
  }
  const std::string on_host = fmt::format("XLOCO_RANKS_ON_HOST={}", K * a.nproc);
  common::install_forwarding_handlers();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<pid_t> pids;
  std::vector<std::string> labels;
  std::vector<std::string> head_env{on_host};
  // The token goes by environment (`ps` shows argv to every user of the machine).
  if (!a.http_token.empty()) head_env.push_back("XLOCO_HTTP_TOKEN=" + a.http_token);
  pids.push_back(common::spawn_child({"head", head_argv, head_env}));
  labels.push_back("head");
  try {
    const std::string endpoint = wait_for_endpoint(run_dir / "head.endpoint", pids[0]);
    for (const int i : start_order(a, K)) {
      if (!a.start_order.empty() && pids.size() > 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
      labels.push_back(fmt::format("provider-{}", i));
      pids.push_back(common::spawn_child({labels.back(), worker_argv(a, i, endpoint, keys),
                                          {"XLOCO_RANKS_ON_HOST=" + std::to_string(K)}}));
    }
  } catch (const common::Error& e) {
    spdlog::error("{}", e.what());
    for (pid_t p : pids) ::kill(p, SIGTERM);
    common::wait_children(pids, labels);
    return 1;
  }
  common::WaitOptions wo;
  wo.critical.assign(pids.size(), false);
  wo.critical[0] = true;  // the head; providers may die and come back (elastic)
  const auto results = common::wait_children(pids, labels, wo);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (common::pending_signal() != 0) {
    fmt::print("interrupted; every child process has been stopped. Resume the run with "
               "`xloco local --resume` and the same config.\n");
    return 130;
  }
  const auto verdict = local_exit(results);
  if (!verdict.message.empty()) {
    if (verdict.code == 130) {
      fmt::print("{}\n", verdict.message);
    } else {
      spdlog::error("{}", verdict.message);
    }
    return verdict.code;
  }
  for (const auto& r : results) {
    if (r.exit_code != 0) {
      spdlog::warn("{} exited with code {} during the run (the head went on without it)", r.label,
                   r.exit_code);
    }
  }
  print_summary(run_dir, wall);
  return 0;
}

}  // namespace

void add_local_command(CLI::App& app) {
  auto a = std::make_shared<LocalArgs>();
  auto* cmd = app.add_subcommand("local", "a head and K providers on this machine (loopback)");
  cmd->add_option("--config", a->config, "JSON run config")->required()->check(CLI::ExistingFile);
  cmd->add_option("--set", a->overrides, "override a config value, e.g. --set outer.inner_steps=25");
  cmd->add_option("--providers", a->providers, "K providers (default: outer.providers)")->check(CLI::Range(1, 64));
  cmd->add_option("--nproc", a->nproc, "ranks per provider")->check(CLI::Range(1, 64));
  cmd->add_flag("--insecure", a->insecure, "plaintext links (default: CURVE with generated keys)");
  cmd->add_flag("--resume", a->resume, "the head continues from the run's latest checkpoint");
  cmd->add_option("--start-order", a->start_order,
                  "start the providers in this order, half a second apart, e.g. 3,2,1,0 (the "
                  "run's result does not depend on it: a reproducibility check)")
      ->delimiter(',');
  cmd->add_option("--init", a->init,
                  "warm start θ from an xloco checkpoint directory, a Hugging Face GPT-2 "
                  "directory or a nanoGPT-named .safetensors file (see `xloco head --init`)")
      ->check(CLI::ExistingPath);
  cmd->add_option("--http-token", a->http_token,
                  "the head's --http-token: a bearer token /status and /metrics require beyond "
                  "loopback (passed to the head by environment)")
      ->envname("XLOCO_HTTP_TOKEN");
  cmd->add_option("--http", a->http,
                  "the head's dashboard and status port, HOST:PORT (default 127.0.0.1:0: a free "
                  "port; the URL is logged and written to runs/NAME/status.url)");
  cmd->add_option("--baseline", a->baseline,
                  "draw this `xloco train` run's eval curve on the dashboard "
                  "(runs/NAME/metrics/provider-0.jsonl)")
      ->check(CLI::ExistingFile);
  cmd->callback([a]() {
    const int rc = run_local(*a);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace xloco::cli
