// `xloco sample --checkpoint DIR --prompt TEXT`: continue a prompt with a trained gpt.
#include <torch/torch.h>

#include "cli/commands.h"
#include "common/error.h"
#include "inner/checkpoint.h"
#include "inner/runtime.h"
#include "inner/tokenizer.h"

namespace xloco::cli {

void add_sample_command(CLI::App& app) {
  struct Args {
    std::string checkpoint, prompt = "And God said", device = "cpu";
    int tokens = 200, top_k = 40;
    double temperature = 0.8;
    uint64_t seed = 1;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("sample", "generate text from a gpt checkpoint");
  cmd->add_option("--checkpoint", a->checkpoint, "checkpoint directory")->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--prompt", a->prompt, "text to continue");
  cmd->add_option("--tokens", a->tokens, "tokens to generate (bytes for a byte-level run)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--temperature", a->temperature, "0 = greedy")->check(CLI::Range(0.0, 10.0));
  cmd->add_option("--top-k", a->top_k, "sample among the k most likely tokens (0 = all)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--seed", a->seed, "sampling seed");
  cmd->add_option("--device", a->device, "auto | cpu | cuda");
  cmd->callback([a]() {
    auto loaded = inner::load_model_checkpoint(a->checkpoint, a->device);
    XLOCO_ENFORCE(loaded.config.model.kind == common::ModelKind::kGpt, common::ConfigError,
                  "{} holds a {} model; sample needs a gpt", a->checkpoint,
                  common::to_string(loaded.config.model.kind));
    inner::configure_threads(loaded.config.run, 1);
    const auto tokenizer = inner::tokenizer_for(loaded.config.data);
    XLOCO_ENFORCE(tokenizer != nullptr, common::IoError,
                  "the run's data folder {} has no tokenizer.model to encode the prompt and decode "
                  "the sample with (llm.c shards made elsewhere: use their tokenizer)",
                  loaded.config.data.path);
    const auto ids = inner::generate(*loaded.model, tokenizer->encode(a->prompt), a->tokens,
                                     a->temperature, a->top_k, a->seed);
    fmt::print("{}{}\n", a->prompt, tokenizer->decode(ids));
  });
}

}  // namespace xloco::cli
