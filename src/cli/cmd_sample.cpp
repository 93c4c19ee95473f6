// `xloco sample --checkpoint DIR --prompt TEXT`: continue a prompt with a trained gpt (or a
// TorchScript text model with a logits method). For an image model (a TorchScript module with
// sample(n)): `--out GRID.png`, and with `--classifier CNN_CHECKPOINT` a score of the samples.
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "cli/commands.h"
#include "cli/png.h"
#include "common/error.h"
#include "inner/checkpoint.h"
#include "inner/data.h"
#include "inner/runtime.h"
#include "inner/tokenizer.h"

namespace xloco::cli {

namespace {

// Scores image samples [n, 1, 28, 28] in [0, 1] with a Fashion-MNIST classifier: the class
// histogram and exp(E_x KL(p(y|x) || p(y))), the Inception score with the project's own cnn in
// place of Inception (10 = every class equally often and each sample confidently one class).
nlohmann::json score_samples(const torch::Tensor& samples, const std::string& classifier) {
  auto cnn = inner::load_model_checkpoint(classifier, "cpu");
  XLOCO_ENFORCE(cnn.config.model.kind == common::ModelKind::kCnn, common::ConfigError,
                "--classifier {} holds a {} model, not the Fashion-MNIST cnn", classifier,
                common::to_string(cnn.config.model.kind));
  XLOCO_ENFORCE(samples.dim() == 4 && samples.size(1) == 1 && samples.size(2) == 28 &&
                    samples.size(3) == 28,
                common::ConfigError, "--classifier scores 1x28x28 images, the samples are {}",
                c10::str(samples.sizes()));
  torch::NoGradGuard guard;
  cnn.model->eval();
  const auto x = (samples.to(torch::kCPU) - inner::kFmnistMean) / inner::kFmnistStd;
  std::vector<torch::Tensor> probs;
  for (int64_t i = 0; i < x.size(0); i += 256) {
    probs.push_back(cnn.model->logits(x.narrow(0, i, std::min<int64_t>(256, x.size(0) - i)))
                        .softmax(-1).to(torch::kFloat64));
  }
  const auto p = torch::cat(probs);
  const auto marginal = p.mean(0, /*keepdim=*/true);
  const auto kl = (p * ((p + 1e-12).log() - (marginal + 1e-12).log())).sum(1);
  const auto hist = torch::bincount(p.argmax(1), {}, 10);
  std::vector<int64_t> histogram(10);
  for (int i = 0; i < 10; ++i) histogram[i] = hist[i].item<int64_t>();
  return {{"samples", samples.size(0)},
          {"inception_score", std::exp(kl.mean().item<double>())},
          {"mean_max_prob", std::get<0>(p.max(1)).mean().item<double>()},
          {"class_histogram", histogram}};
}

template <class Args>
void sample_images(const Args& a, inner::LoadedModel& loaded) {
  torch::NoGradGuard guard;
  loaded.model->eval();
  torch::manual_seed(a.seed);
  std::vector<torch::Tensor> parts;
  for (int64_t done = 0; done < a.images;) {
    const int64_t n = std::min<int64_t>(256, a.images - done);
    parts.push_back(loaded.model->sample(n).to(torch::kCPU).to(torch::kFloat32).clamp(0, 1));
    done += n;
    if (a.images > 256) spdlog::info("sampled {}/{} images", done, a.images);
  }
  const auto samples = torch::cat(parts);
  if (!a.out.empty()) {
    const int64_t n = std::min(a.grid_images, samples.size(0));
    const auto bytes = (samples.narrow(0, 0, n) * 255.0).round().to(torch::kUInt8).contiguous();
    std::vector<uint8_t> pixels(bytes.data_ptr<uint8_t>(), bytes.data_ptr<uint8_t>() + bytes.numel());
    const auto cols = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(n))));
    write_png_grid(a.out, pixels, n, samples.size(1), samples.size(2), samples.size(3), cols);
    fmt::print("wrote {} ({} samples, {} x {})\n", a.out, n, samples.size(2), samples.size(3));
  }
  if (!a.classifier.empty()) {
    const auto score = score_samples(samples, a.classifier);
    fmt::print("{}\n", score.dump());
    if (!a.score_out.empty()) {
      std::ofstream(a.score_out) << score.dump(2) << "\n";
    }
  }
}

}  // namespace

void add_sample_command(CLI::App& app) {
  struct Args {
    std::string checkpoint, prompt = "And God said", device = "cpu";
    int tokens = 200, top_k = 40;
    double temperature = 0.8;
    uint64_t seed = 1;
    int64_t images = 64, grid_images = 64;
    std::string out, classifier, score_out;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("sample", "generate text (gpt) or an image grid (image models) "
                                            "from a checkpoint");
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
  cmd->add_option("--images", a->images, "image models: samples to draw")
      ->check(CLI::Range(1, 1000000));
  cmd->add_option("--out", a->out, "image models: PNG grid of the first --grid-images samples");
  cmd->add_option("--grid-images", a->grid_images, "image models: samples in the grid")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--classifier", a->classifier,
                  "image models: a Fashion-MNIST cnn checkpoint that scores the samples (class "
                  "histogram, Inception-score analogue)")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--score-out", a->score_out, "image models: write the score as JSON here");
  cmd->callback([a]() {
    auto loaded = inner::load_model_checkpoint(a->checkpoint, a->device);
    inner::configure_threads(loaded.config.run, 1);
    if (loaded.model->can_sample()) {
      sample_images(*a, loaded);
      return;
    }
    XLOCO_ENFORCE(loaded.model->context_length() > 0, common::ConfigError,
                  "{} holds a {} model that neither generates text (gpt, or a TorchScript module "
                  "with logits) nor images (a TorchScript module with sample)", a->checkpoint,
                  common::to_string(loaded.config.model.kind));
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
