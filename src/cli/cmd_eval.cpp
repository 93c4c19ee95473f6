// `xloco eval --checkpoint DIR`: the validation loss (and accuracy for the cnn) of a checkpoint;
// for text, also in nats per byte of the text the validation tokens decode to, which compares
// runs with different tokenizers. `--logits-out` keeps the logits of one validation window, for
// checking the model against another implementation.
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "cli/commands.h"
#include "common/error.h"
#include "common/safetensors.h"
#include "inner/checkpoint.h"
#include "inner/runtime.h"
#include "inner/tokenizer.h"
#include "inner/trainer.h"

namespace xloco::cli {
namespace {

common::TensorBlob blob_of(const std::string& name, const torch::Tensor& t) {
  const auto c = t.contiguous().cpu();
  common::TensorBlob b{name, c.scalar_type() == torch::kInt64 ? "I64" : "F32",
                       c.sizes().vec(), {}};
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  b.data.assign(p, p + c.nbytes());
  return b;
}

}  // namespace

void add_eval_command(CLI::App& app) {
  struct Args {
    std::string checkpoint, device = "cpu", logits_out;
    int batch_size = 0, batches = 0;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("eval", "validation loss of a checkpoint");
  cmd->add_option("--checkpoint", a->checkpoint, "checkpoint directory (…/ckpt/step-0001000)")
      ->required()->check(CLI::ExistingDirectory);
  cmd->add_option("--device", a->device, "auto | cpu | cuda");
  cmd->add_option("--logits-out", a->logits_out,
                  "gpt: write the first validation window's tokens and logits to this "
                  "safetensors file (tensors `tokens` [1, T] and `logits` [1, T, vocab])");
  cmd->add_option("--batch-size", a->batch_size,
                  "validation batch size (default: the run's inner.batch_size); two checkpoints "
                  "scored with the same size and --batches see the same examples (and, for a "
                  "diffusion model, the same noise)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--batches", a->batches, "validation batches (default: inner.eval_batches)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->callback([a]() {
    auto loaded = inner::load_model_checkpoint(a->checkpoint, a->device);
    if (a->batch_size > 0) loaded.config.inner.batch_size = a->batch_size;
    if (a->batches > 0) loaded.config.inner.eval_batches = a->batches;
    inner::configure_threads(loaded.config.run, 1);
    auto data = inner::make_dataset(loaded.config, {0, 1});
    inner::Group solo(inner::DistOptions{});
    inner::InnerTrainer trainer(loaded.config, loaded.model, solo,
                                inner::resolve_device(a->device));
    const auto e = trainer.evaluate(*data);
    // Text (gpt, or a TorchScript model on a text data set) counts tokens; fmnist images.
    const bool text = loaded.config.data.dataset != common::DatasetKind::kFmnist;
    const auto batches = data->eval_batches(0, 1);  // what evaluate() scored, cut once more here
    std::string per_byte;
    if (const auto tokenizer = text ? inner::tokenizer_for(loaded.config.data) : nullptr) {
      const auto lengths = tokenizer->token_bytes();
      int64_t bytes = 0;
      for (const auto& b : batches) {
        const auto y = b.y.contiguous();
        const auto* p = y.data_ptr<int64_t>();
        for (int64_t i = 0; i < y.numel(); ++i) {
          bytes += p[i] < static_cast<int64_t>(lengths.size()) ? lengths[p[i]] : 0;
        }
      }
      if (bytes > 0) {
        per_byte = fmt::format(" | {:.4f} nats per byte ({:.3f} bytes per token)",
                               e.loss * static_cast<double>(e.count) / bytes,
                               static_cast<double>(bytes) / e.count);
      }
    }
    fmt::print("eval loss {:.4f}{}{} over {} {} (step {})\n", e.loss,
               e.accuracy ? fmt::format(" | accuracy {:.2f}%", 100 * *e.accuracy) : "",
               per_byte, e.count, text ? "tokens" : "images", loaded.step);
    if (!a->logits_out.empty()) {
      XLOCO_ENFORCE(text && loaded.model->has_logits(), common::ConfigError,
                    "--logits-out needs a text model with logits (gpt, or a TorchScript module "
                    "with a logits method)");
      torch::NoGradGuard guard;
      loaded.model->eval();
      const auto x = batches.front().x.narrow(0, 0, 1);
      const auto logits = loaded.model->logits(x.to(inner::resolve_device(a->device)));
      common::write_safetensors(a->logits_out, {blob_of("tokens", x),
                                                blob_of("logits", logits.to(torch::kFloat32))});
      fmt::print("logits of one validation window ({} tokens) written to {}\n", x.size(1),
                 a->logits_out);
    }
  });
}

}  // namespace xloco::cli
