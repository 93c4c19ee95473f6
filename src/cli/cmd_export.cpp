// `xloco export --checkpoint DIR --format hf --out OUT`: a checkpoint as a Hugging Face GPT-2
// directory that transformers (and any safetensors reader) loads. The mapping is in src/inner/hf.
#include <fmt/format.h>

#include "cli/commands.h"
#include "inner/hf.h"

namespace xloco::cli {

void add_export_command(CLI::App& app) {
  struct Args {
    inner::HfExportOptions o;
    std::string format = "hf";
  };
  auto a = std::make_shared<Args>();  // the callback owns it: CLI11 writes into these fields
  auto* o = &a->o;
  auto* cmd = app.add_subcommand("export", "write a checkpoint in another tool's format");
  cmd->add_option("--checkpoint", o->checkpoint, "checkpoint directory (…/ckpt/step-0001000)")
      ->required()->check(CLI::ExistingDirectory);
  cmd->add_option("--format", a->format, "hf: a Hugging Face GPT-2 directory")
      ->check(CLI::IsMember({"hf"}));
  cmd->add_option("--out", o->out, "directory to write")->required();
  cmd->add_option("--tokenizer", o->tokenizer,
                  "tokenizer.model to ship (default: the run's data.path/tokenizer.model)")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--overwrite", o->overwrite, "replace files in an existing --out");
  cmd->callback([a]() { fmt::print("{}\n", inner::export_hf(a->o)); });
}

}  // namespace xloco::cli
