// `xloco train`: one provider cluster training on its own (no head), llm.c style: build the
// model, data and optimizer, then loop with one progress line per log step. `--nproc R` makes
// this process a launcher that starts R rank processes (a Gloo group) and reaps them.
#include <chrono>
#include <filesystem>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "cli/commands.h"
#include "cli/launch.h"
#include "common/checkpoint.h"
#include "common/error.h"
#include "common/metrics.h"
#include "common/process.h"
#include "common/safetensors.h"
#include "inner/blas_core.h"
#include "inner/checkpoint.h"
#include "inner/data.h"
#include "inner/hf.h"
#include "inner/runtime.h"
#include "inner/trainer.h"

namespace xloco::cli {
namespace {
namespace fs = std::filesystem;

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;
  int nproc = 1;
  bool resume = false;
  std::string init;
};

int run_rank(const TrainArgs& a, const common::Config& cfg) {
  auto dist = inner::dist_options_from_env();
  const auto threads = inner::configure_threads(cfg.run, ranks_on_host(dist.world));
  const bool leader = dist.rank == 0;
  if (!leader) spdlog::set_level(spdlog::level::warn);
  const auto device = inner::resolve_device(cfg.run.device, dist.rank);
  dist.device = device;
  const fs::path run_dir = fs::path(cfg.run.dir) / cfg.run.name;
  const std::string ckpt_root = (run_dir / "ckpt").string();
  XLOCO_ENFORCE(cfg.inner.batch_size % dist.world == 0, common::ConfigError,
                "inner.batch_size = {} must be divisible by the {} ranks", cfg.inner.batch_size,
                dist.world);
  if (leader) {
    fs::create_directories(run_dir);
    common::write_file_atomic((run_dir / "config.json").string(), common::to_json_string(cfg) + "\n");
  }
  common::install_forwarding_handlers();

  auto data = inner::make_dataset(cfg, {0, 1});
  inner::Group group(dist);
  inner::InnerTrainer trainer(cfg, inner::make_model(cfg), group, device);
  const int64_t vocab = trainer.model().declared_vocab();
  spdlog::info("{}{} | {} params | {} | {} rank(s) x {} intra-op x {} OpenBLAS thread(s) on {}",
               common::to_string(cfg.model.kind),
               vocab > 0 ? fmt::format(" (vocabulary {})", vocab) : std::string(),
               inner::count_parameters(trainer.model()), data->describe(), dist.world,
               threads.intra_op, threads.blas, device.str());
  spdlog::info("{} | {} | ranks over {} | precision {}", inner::blas_core_summary(),
               inner::torch_summary(), group.backend(), common::to_string(cfg.run.precision));

  int64_t start = 0;
  if (!a.init.empty()) {
    trainer.load_model(inner::load_init_weights(a.init));  // a resumed run overwrites it below
    spdlog::info("initial weights from {}", a.init);
  }
  if (a.resume) {
    if (auto dir = common::latest_checkpoint(ckpt_root)) {
      start = inner::resume_train_checkpoint(*dir, trainer);
      spdlog::info("resumed from {} at step {}", *dir, start);
    } else {
      spdlog::warn("--resume: no checkpoint under {}, starting from scratch", ckpt_root);
    }
  }
  common::JsonlWriter metrics;
  if (leader) metrics.open((run_dir / "metrics" / "provider-0.jsonl").string());

  const auto& in = cfg.inner;
  auto do_eval = [&](int64_t step) {
    const auto e = trainer.evaluate(*data);
    group.check_same("parameters", trainer.param_hash());
    std::string acc = e.accuracy ? fmt::format(" | accuracy {:.2f}%", 100 * *e.accuracy) : "";
    spdlog::info("eval step {} | val loss {:.4f}{}", step, e.loss, acc);
    nlohmann::json rec = {{"step", step}, {"eval_loss", e.loss}};
    if (e.accuracy) rec["eval_accuracy"] = *e.accuracy;
    metrics.write(rec);
    return e;
  };

  const auto t0 = std::chrono::steady_clock::now();
  auto window_start = t0;
  int64_t window_tokens = 0, step = start;
  bool interrupted = false;
  for (; step < in.steps && !interrupted; ++step) {
    const auto st = trainer.train_step(*data, step, common::pending_signal() != 0);
    interrupted = st.stop;
    window_tokens += st.tokens;
    const bool last = step + 1 == in.steps || interrupted;
    if ((step + 1) % in.log_every == 0 || last) {
      const auto now = std::chrono::steady_clock::now();
      const double secs = std::chrono::duration<double>(now - window_start).count();
      const double rate = window_tokens / std::max(secs, 1e-9);
      const double elapsed = std::chrono::duration<double>(now - t0).count();
      const double eta = elapsed / static_cast<double>(step + 1 - start) * (in.steps - step - 1);
      spdlog::info("step {}/{} | loss {:.4f} | lr {:.2e} | {} tok/s | ETA {}", step + 1,
                   in.steps, st.loss, st.lr, common::human_rate(rate), common::human_duration(eta));
      metrics.write({{"step", step + 1}, {"loss", st.loss}, {"lr", st.lr},
                     {"grad_norm", st.grad_norm}, {"tokens_per_s", rate}});
      window_start = now;
      window_tokens = 0;
    }
    if (in.eval_every > 0 && (step + 1) % in.eval_every == 0 && !last) do_eval(step + 1);
    if (leader && in.checkpoint_every > 0 && (step + 1) % in.checkpoint_every == 0 && !last) {
      inner::save_train_checkpoint(ckpt_root, trainer, cfg, step + 1);
    }
  }
  if (interrupted) {
    if (leader) {
      const auto dir = inner::save_train_checkpoint(ckpt_root, trainer, cfg, step);
      spdlog::warn("interrupted at step {}; saved {} (continue with --resume)", step, dir);
    }
    return 130;
  }
  const auto e = do_eval(step);
  if (leader) {
    const auto dir = inner::save_train_checkpoint(ckpt_root, trainer, cfg, step);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print("final eval loss {:.4f}{} after {} steps in {} | checkpoint {}\n", e.loss,
               e.accuracy ? fmt::format(" (accuracy {:.2f}%)", 100 * *e.accuracy) : "", step,
               common::human_duration(wall), dir);
  }
  return 0;
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  auto* cmd = app.add_subcommand("train", "train one provider cluster (no head)");
  cmd->add_option("--config", a->config, "JSON run config (configs/*.json)")->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", a->overrides, "override a config value, e.g. --set inner.lr=3e-4");
  cmd->add_option("--nproc", a->nproc, "rank processes (a Gloo group) on this machine")
      ->check(CLI::Range(1, 256));
  cmd->add_flag("--resume", a->resume, "continue from the run's latest checkpoint");
  cmd->add_option("--init", a->init, "start from these weights: an xloco checkpoint directory, a "
                  "Hugging Face GPT-2 directory or a .safetensors file with the model's names");
  cmd->callback([a]() {
    const auto cfg = inner::load_run_config(a->config, a->overrides);
    int rc;
    if (a->nproc > 1 && !is_rank_process()) {
      rc = launch_ranks(original_argv(), a->nproc, (fs::path(cfg.run.dir) / cfg.run.name).string());
    } else {
      rc = run_rank(*a, cfg);
    }
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace xloco::cli
