// `xloco eval --checkpoint DIR`: the validation loss (and accuracy for the cnn) of a checkpoint.
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "cli/commands.h"
#include "inner/checkpoint.h"
#include "inner/runtime.h"
#include "inner/trainer.h"

namespace xloco::cli {

void add_eval_command(CLI::App& app) {
  struct Args {
    std::string checkpoint, device = "cpu";
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("eval", "validation loss of a checkpoint");
  cmd->add_option("--checkpoint", a->checkpoint, "checkpoint directory (…/ckpt/step-0001000)")
      ->required()->check(CLI::ExistingDirectory);
  cmd->add_option("--device", a->device, "auto | cpu | cuda");
  cmd->callback([a]() {
    auto loaded = inner::load_model_checkpoint(a->checkpoint, a->device);
    inner::configure_threads(loaded.config.run, 1);
    auto data = inner::make_dataset(loaded.config, {0, 1});
    inner::Group solo(inner::DistOptions{});
    inner::InnerTrainer trainer(loaded.config, loaded.model, solo,
                                inner::resolve_device(a->device));
    const auto e = trainer.evaluate(*data);
    fmt::print("eval loss {:.4f}{} over {} {} (step {})\n", e.loss,
               e.accuracy ? fmt::format(" | accuracy {:.2f}%", 100 * *e.accuracy) : "", e.count,
               loaded.config.model.kind == common::ModelKind::kGpt ? "bytes" : "images", loaded.step);
  });
}

}  // namespace xloco::cli
