#include "inner/model.h"

#include <cmath>

#include <torch/torch.h>

#include "common/error.h"
#include "inner/data.h"
#include "inner/kernels.h"
#include "inner/script_model.h"

namespace xloco::inner {
namespace F = torch::nn::functional;
using torch::nn::LayerNorm;
using torch::nn::LayerNormOptions;
using torch::nn::Linear;

namespace {

struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int d, int heads, bool fused) : n_head(heads), fused(fused) {
    c_attn = register_module("c_attn", Linear(d, 3 * d));
    c_proj = register_module("c_proj", Linear(d, d));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto qkv = c_attn(x);
    return c_proj(fused ? causal_attention(qkv, n_head) : causal_attention_aten(qkv, n_head));
  }
  int n_head;
  bool fused;  // run.kernels: src/inner/kernels.h, or LibTorch's ops
  Linear c_attn{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(Attention);

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int d) {
    c_fc = register_module("c_fc", Linear(d, 4 * d));
    c_proj = register_module("c_proj", Linear(4 * d, d));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return c_proj(torch::gelu(c_fc(x)));  // exact (erf) GELU, as nanoGPT
  }
  Linear c_fc{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(Mlp);

struct BlockImpl : torch::nn::Module {
  BlockImpl(int d, int heads, bool fused) {
    ln_1 = register_module("ln_1", LayerNorm(LayerNormOptions({d})));
    attn = register_module("attn", Attention(d, heads, fused));
    ln_2 = register_module("ln_2", LayerNorm(LayerNormOptions({d})));
    mlp = register_module("mlp", Mlp(d));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn(ln_1(x));
    return x + mlp(ln_2(x));
  }
  LayerNorm ln_1{nullptr}, ln_2{nullptr};
  Attention attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

struct TransformerImpl : torch::nn::Module {
  TransformerImpl(const common::ModelConfig& m, bool fused) {
    wte = register_module("wte", torch::nn::Embedding(m.vocab_size, m.d_model));
    wpe = register_module("wpe", torch::nn::Embedding(m.seq_len, m.d_model));
    h = register_module("h", torch::nn::ModuleList());
    for (int i = 0; i < m.n_layer; ++i) h->push_back(Block(m.d_model, m.n_head, fused));
    ln_f = register_module("ln_f", LayerNorm(LayerNormOptions({m.d_model})));
  }
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  LayerNorm ln_f{nullptr};
};
TORCH_MODULE(Transformer);

class Gpt : public Net {
 public:
  Gpt(const common::ModelConfig& m, bool fused_kernels) : config_(m) {
    transformer = register_module("transformer", Transformer(m, fused_kernels));
    // nanoGPT init: normal(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer).
    torch::NoGradGuard guard;
    for (auto& p : named_parameters()) {
      const auto& name = p.key();
      auto& t = p.value();
      if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
        t.zero_();
      } else if (t.dim() >= 2) {
        const bool residual = name.find("c_proj.weight") != std::string::npos;
        t.normal_(0.0, residual ? 0.02 / std::sqrt(2.0 * m.n_layer) : 0.02);
      }
    }
  }

  torch::Tensor logits(const torch::Tensor& x) override {
    const auto T = x.size(1);
    TORCH_CHECK(T <= config_.seq_len, "sequence length ", T, " exceeds model.seq_len ",
                config_.seq_len);
    auto pos = torch::arange(T, x.options().dtype(torch::kInt64));
    auto hidden = transformer->wte(x) + transformer->wpe(pos);
    for (const auto& block : *transformer->h) hidden = block->as<Block>()->forward(hidden);
    hidden = transformer->ln_f(hidden);
    return F::linear(hidden, transformer->wte->weight);  // tied head, no bias
  }

  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y) override {
    auto lg = logits(x);
    return F::cross_entropy(lg.view({-1, lg.size(-1)}), y.reshape({-1}));
  }

  int64_t context_length() const override { return config_.seq_len; }

  Transformer transformer{nullptr};

 private:
  common::ModelConfig config_;
};

class Cnn : public Net {
 public:
  Cnn() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3)));
    fc1 = register_module("fc1", Linear(9216, 128));
    fc2 = register_module("fc2", Linear(128, 10));
  }
  torch::Tensor logits(const torch::Tensor& x) override {
    auto h = torch::relu(conv1(x));
    h = torch::relu(conv2(h));
    h = torch::max_pool2d(h, 2).flatten(1);
    return fc2(torch::relu(fc1(h)));
  }
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y) override {
    return F::cross_entropy(logits(x), y);
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  Linear fc1{nullptr}, fc2{nullptr};
};

}  // namespace

std::mutex& rng_mutex() {
  static std::mutex mu;
  return mu;
}

std::shared_ptr<Net> make_model(const common::Config& config) {
  std::lock_guard<std::mutex> rng(rng_mutex());
  torch::manual_seed(config.run.seed);
  if (config.model.kind == common::ModelKind::kTorchScript) {
    return load_script_model(config);
  }
  if (config.model.kind == common::ModelKind::kGpt) {
    common::Config c = config;
    if (c.model.vocab_size == 0) resolve_vocab(c);  // configs written before model.vocab_size
    return std::make_shared<Gpt>(c.model, c.run.kernels == common::Kernels::kFused);
  }
  return std::make_shared<Cnn>();
}

int64_t count_parameters(Net& model) {
  int64_t n = 0;
  for (const auto& t : model.state()) n += t.trained ? t.tensor.numel() : 0;
  return n;
}

torch::Tensor Net::sample(int64_t) {
  throw common::Error("this model cannot sample images (a TorchScript module needs a sample(n) method)");
}

torch::Device Net::device() {
  const auto s = state();
  return s.empty() ? torch::Device(torch::kCPU) : s.front().tensor.device();
}

std::vector<uint32_t> generate(Net& gpt, const std::vector<uint32_t>& prompt, int max_new,
                               double temperature, int top_k, uint64_t seed) {
  XLOCO_ENFORCE(gpt.context_length() > 0, common::Error, "sampling needs a gpt model");
  torch::NoGradGuard guard;
  gpt.eval();
  auto gen = torch::make_generator<at::CPUGeneratorImpl>(seed);
  const auto device = gpt.device();
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  if (ids.empty()) ids.push_back('\n');
  std::vector<uint32_t> out;
  for (int i = 0; i < max_new; ++i) {
    const auto ctx = std::min<int64_t>(static_cast<int64_t>(ids.size()), gpt.context_length());
    auto x = torch::tensor(std::vector<int64_t>(ids.end() - ctx, ids.end()), torch::kInt64)
                 .unsqueeze(0).to(device);
    auto lg = gpt.logits(x).select(1, ctx - 1).squeeze(0).to(torch::kCPU).to(torch::kFloat64);
    int64_t next;
    if (temperature <= 0) {
      next = lg.argmax().item<int64_t>();
    } else {
      lg = lg / temperature;
      if (top_k > 0 && top_k < lg.size(0)) {
        auto kth = std::get<0>(lg.topk(top_k)).min();
        lg = lg.masked_fill(lg < kth, -INFINITY);
      }
      next = torch::multinomial(lg.softmax(-1), 1, false, gen).item<int64_t>();
    }
    ids.push_back(next);
    out.push_back(static_cast<uint32_t>(next));
  }
  return out;
}

}  // namespace xloco::inner
