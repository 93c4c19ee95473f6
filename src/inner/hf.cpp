#include "inner/hf.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "common/error.h"
#include "inner/checkpoint.h"
#include "inner/tokenizer.h"
#include "inner/trainer.h"

namespace xloco::inner {
namespace fs = std::filesystem;
using common::IoError;
using common::TensorBlob;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

TensorBlob f32_blob(const std::string& name, const torch::Tensor& t) {
  const auto c = t.to(torch::kCPU).to(torch::kFloat32).contiguous();
  TensorBlob b{name, "F32", c.sizes().vec(), {}};
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  b.data.assign(p, p + c.nbytes());
  return b;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  XLOCO_ENFORCE(in.good(), IoError, "cannot open {}", path);
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  XLOCO_ENFORCE(!j.is_discarded() && j.is_object(), IoError, "{} is not a JSON object", path);
  return j;
}

// Buffers and the tied head that some GPT-2 files carry next to the parameters.
bool skipped(const std::string& name) {
  return name == "lm_head.weight" || ends_with(name, ".attn.bias") ||
         ends_with(name, ".attn.masked_bias");
}

}  // namespace

bool is_conv1d_weight(const std::string& name) {
  return ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_proj.weight") ||
         ends_with(name, "mlp.c_fc.weight") || ends_with(name, "mlp.c_proj.weight");
}

std::string export_hf(const HfExportOptions& o) {
  auto loaded = load_model_checkpoint(o.checkpoint, "cpu");
  const auto& c = loaded.config;
  XLOCO_ENFORCE(c.model.kind == common::ModelKind::kGpt, common::ConfigError,
                "{} holds a {} model; --format hf exports gpt models", o.checkpoint,
                common::to_string(c.model.kind));
  XLOCO_ENFORCE(o.overwrite || !fs::exists(o.out), common::ConfigError,
                "{} already exists; pass --overwrite to replace it", o.out);
  fs::create_directories(o.out);

  std::vector<TensorBlob> blobs;
  torch::NoGradGuard guard;
  int64_t vocab = 0;
  for (const auto& p : loaded.model->named_parameters()) {
    const auto& name = p.key();
    if (name == "transformer.wte.weight") vocab = p.value().size(0);
    blobs.push_back(f32_blob(name, is_conv1d_weight(name) ? p.value().t() : p.value()));
  }
  // transformers refuses safetensors files without format=pt in their metadata.
  common::write_safetensors((fs::path(o.out) / "model.safetensors").string(), blobs,
                            {{"format", "pt"}});

  std::string tokenizer_path = o.tokenizer;
  if (tokenizer_path.empty() && c.data.dataset == common::DatasetKind::kTokens) {
    tokenizer_path = (fs::path(c.data.path) / "tokenizer.model").string();
    if (!fs::exists(tokenizer_path)) {
      spdlog::warn("{} is not here: the export has no tokenizer (pass --tokenizer FILE)",
                   tokenizer_path);
      tokenizer_path.clear();
    }
  }
  int64_t bos = 0, eos = 0;
  std::string tokenizer_note = "bytes: token id = byte value (vocabulary 256)";
  if (!tokenizer_path.empty()) {
    const auto tok = load_sentencepiece(tokenizer_path);
    XLOCO_ENFORCE(tok->vocab_size() <= vocab, common::ConfigError,
                  "tokenizer {} has {} pieces, more than the model's vocabulary of {}",
                  tokenizer_path, tok->vocab_size(), vocab);
    eos = std::max<int64_t>(0, tok->eos_id());
    bos = eos > 0 ? 1 : 0;
    fs::copy_file(tokenizer_path, fs::path(o.out) / "tokenizer.model",
                  fs::copy_options::overwrite_existing);
    // A SentencePiece model with no dummy prefix and byte fallback (xloco prepare's): no bos or
    // eos added on encode, so that the ids match xloco's token files. add_prefix_space false:
    // without it transformers' fast tokenizer prepends "▁" to the text (a dummy prefix the model
    // does not have), and the first id differs from SentencePiece's (ctest hf.transformers).
    const nlohmann::ordered_json tc = {
        {"tokenizer_class", "LlamaTokenizer"}, {"add_bos_token", false},
        {"add_eos_token", false},              {"legacy", true},
        {"add_prefix_space", false},
        {"clean_up_tokenization_spaces", false}, {"model_max_length", c.model.seq_len},
        {"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"},
    };
    common::write_file_atomic((fs::path(o.out) / "tokenizer_config.json").string(),
                              tc.dump(2) + "\n");
    const nlohmann::ordered_json st = {
        {"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}};
    common::write_file_atomic((fs::path(o.out) / "special_tokens_map.json").string(),
                              st.dump(2) + "\n");
    tokenizer_note = "SentencePiece tokenizer.model (byte fallback, no dummy prefix)";
  }
  const nlohmann::ordered_json config = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", vocab},
      {"n_positions", c.model.seq_len},
      {"n_ctx", c.model.seq_len},
      {"n_embd", c.model.d_model},
      {"n_layer", c.model.n_layer},
      {"n_head", c.model.n_head},
      {"n_inner", nullptr},
      // xloco's GELU is the exact (erf) one, which transformers calls "gelu" (GPT-2's own is
      // the tanh approximation, "gelu_new").
      {"activation_function", "gelu"},
      {"layer_norm_epsilon", 1e-5},
      {"resid_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"initializer_range", 0.02},
      {"scale_attn_weights", true},
      {"tie_word_embeddings", true},
      {"bos_token_id", bos},
      {"eos_token_id", eos},
      {"torch_dtype", "float32"},
      {"xloco", {{"checkpoint", o.checkpoint}, {"step", loaded.step}, {"tokenizer", tokenizer_note}}},
  };
  common::write_file_atomic((fs::path(o.out) / "config.json").string(), config.dump(2) + "\n");
  return fmt::format("exported {} ({} parameters, vocabulary {}, step {}) to {} as a Hugging Face "
                     "GPT-2 directory; tokenizer: {}", o.checkpoint,
                     count_parameters(*loaded.model), vocab, loaded.step, o.out, tokenizer_note);
}

common::SafetensorsFile load_init_weights(const std::string& path) {
  XLOCO_ENFORCE(fs::exists(path), IoError, "--init {} does not exist", path);
  if (fs::is_regular_file(path)) {
    // A nanoGPT-named file: nn.Linear weights, already [out, in].
    auto file = common::read_safetensors(path);
    common::SafetensorsFile out;
    for (auto& t : file.tensors) {
      if (!skipped(t.name)) out.tensors.push_back(f32_blob(t.name, from_blob(t)));
    }
    return out;
  }
  const auto hf_config = fs::path(path) / "config.json";
  const auto weights = (fs::path(path) / "model.safetensors").string();
  XLOCO_ENFORCE(fs::exists(weights), IoError,
                "--init {}: no model.safetensors (expected an xloco checkpoint, a Hugging Face "
                "GPT-2 directory or a .safetensors file)", path);
  if (!fs::exists(hf_config)) return common::read_safetensors(weights);  // an xloco checkpoint
  const auto cfg = read_json(hf_config.string());
  XLOCO_ENFORCE(cfg.value("model_type", std::string()) == "gpt2", IoError,
                "--init {}: config.json has model_type {}, only gpt2 is supported", path,
                cfg.value("model_type", std::string("(none)")));
  const auto act = cfg.value("activation_function", std::string("gelu_new"));
  if (act != "gelu") {
    spdlog::warn("--init {}: activation_function {} (xloco uses exact GELU): the model starts "
                 "close to, not exactly at, the original", path, act);
  }
  auto file = common::read_safetensors(weights);
  common::SafetensorsFile out;
  for (auto& t : file.tensors) {
    if (skipped(t.name)) continue;
    // GPT2LMHeadModel.save_pretrained writes "transformer.h.0…"; the original hub files "h.0…".
    const std::string name = t.name.rfind("transformer.", 0) == 0 ? t.name : "transformer." + t.name;
    auto tensor = from_blob(t);
    out.tensors.push_back(f32_blob(name, is_conv1d_weight(name) ? tensor.t() : tensor));
  }
  return out;
}

}  // namespace xloco::inner
