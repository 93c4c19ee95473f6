// `xloco worker --head ADDR`: one provider cluster joining a head. With --nproc R this process
// starts R ranks (a Gloo group); rank 0 is the leader that talks to the head.
#include <algorithm>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "cli/launch.h"
#include "common/config.h"
#include "common/error.h"
#include "inner/blas_core.h"
#include "inner/data.h"
#include "inner/dist.h"
#include "inner/runtime.h"
#include "net/keys.h"
#include "net/zmq/transport.h"
#include "outer/provider/provider.h"

namespace xloco::cli {
namespace fs = std::filesystem;

void add_worker_command(CLI::App& app) {
  struct Args {
    std::string config, head, head_pub, key, name, init;
    std::vector<std::string> overrides;
    int nproc = 1;
    int64_t shard = -1;
    bool insecure = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("worker", "one provider: train with R ranks, sync with the head");
  cmd->add_option("--config", a->config, "JSON run config (the head's)")->required()->check(CLI::ExistingFile)->envname("XLOCO_CONFIG");
  cmd->add_option("--set", a->overrides, "override a config value (must match the head's)")->envname("XLOCO_SET")->delimiter(',');
  cmd->add_option("--head", a->head, "the head's endpoint, tcp://HOST:PORT")->required()->envname("XLOCO_HEAD");
  cmd->add_option("--head-pub", a->head_pub, "the head's public key: Z85 text or a .pub file")->envname("XLOCO_HEAD_PUB");
  cmd->add_option("--key", a->key, "this provider's secret key: a file (xloco keygen) or its Z85 text")->envname("XLOCO_KEY");
  cmd->add_option("--name", a->name, "provider name for logs (default: the key file's stem)")->envname("XLOCO_NAME");
  cmd->add_option("--nproc", a->nproc, "rank processes (a Gloo group) on this machine")->check(CLI::Range(1, 256))->envname("XLOCO_NPROC");
  cmd->add_option("--shard", a->shard,
                  "the data shard to train on, 0..outer.providers-1 (default: any free one); pin "
                  "it so that the run does not depend on the order providers connect in")
      ->check(CLI::Range(int64_t{-1}, int64_t{65535}))
      ->envname("XLOCO_SHARD");
  cmd->add_option("--init", a->init,
                  "the warm-start weights the head was given (its --init): θ is built from them, so "
                  "that joining at the run's start downloads no state (other weights: it is sent)")
      ->check(CLI::ExistingPath)
      ->envname("XLOCO_INIT");
  cmd->add_flag("--insecure", a->insecure, "plaintext, unauthenticated link (loopback experiments only)")->envname("XLOCO_INSECURE");
  cmd->callback([a]() {
    const auto cfg = inner::load_run_config(a->config, a->overrides);
    std::string name = a->name;
    if (name.empty()) {
      name = !a->key.empty() && fs::exists(a->key) ? fs::path(a->key).stem().string() : "provider";
    }
    const fs::path run_dir = fs::path(cfg.run.dir) / cfg.run.name;
    if (a->nproc > 1 && !is_rank_process()) {
      const int rc = launch_ranks(original_argv(), a->nproc, (run_dir / "providers" / name).string());
      if (rc != 0) throw CLI::RuntimeError(rc);
      return;
    }
    auto dist = inner::dist_options_from_env();
    // Ranks wait in a broadcast while their leader waits for the head (a round, or a head that
    // restarts): the group's timeout must outlast both.
    dist.timeout = std::chrono::seconds(
        static_cast<int64_t>(std::max(cfg.outer.round_timeout_s, cfg.outer.head_timeout_s)) + 60);
    inner::configure_threads(cfg.run, ranks_on_host(dist.world));
    dist.device = inner::resolve_device(cfg.run.device, dist.rank);
    if (dist.rank != 0) spdlog::set_level(spdlog::level::warn);
    spdlog::info("{} | {} on {} | precision {}", inner::blas_core_summary(), inner::torch_summary(),
                 dist.device.str(), common::to_string(cfg.run.precision));
    std::unique_ptr<net::Transport> link;
    if (dist.rank == 0) {
      net::zeromq::ClientOptions co;
      co.connect = a->head;
      co.name = name;
      co.link.insecure = a->insecure;
      if (!a->insecure) {
        XLOCO_ENFORCE(!a->key.empty() && !a->head_pub.empty(), common::ConfigError,
                      "worker: --key FILE and --head-pub KEY are required (or --insecure)");
        warn_if_in_argv(a->key, "--key", "XLOCO_KEY");
        co.key = net::keypair_from(a->key, "worker --key / XLOCO_KEY");
        co.server_public_key = net::public_key_from(a->head_pub, "worker --head-pub / XLOCO_HEAD_PUB");
      }
      link = std::make_unique<net::zeromq::Client>(co);
    }
    inner::Group group(dist);
    outer::ProviderOptions po;
    po.name = name;
    po.run_dir = (run_dir / "providers" / name).string();
    po.shard = a->shard;
    po.init = a->init;
    const int rc = outer::run_provider(cfg, po, group, std::move(link));
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace xloco::cli
