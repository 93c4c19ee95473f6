// The tokens data set: llm.c token files, memory-mapped. Training windows never cross a 16 Ki-token
// block, and blocks are what providers split (iid: round-robin; contiguous: runs), as design §4
// splits KJV's 64 KiB blocks. Validation windows are evenly spaced over the val files, so every
// provider and the single-cluster baseline evaluate the same tokens.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "inner/data.h"
#include "inner/tokenizer.h"
#include "inner/tokens.h"

namespace xloco::inner {
namespace fs = std::filesystem;
using common::ConfigError;
using common::IoError;

namespace {

nlohmann::json read_meta(const std::string& dir) {
  const std::string path = (fs::path(dir) / "meta.json").string();
  if (!fs::exists(path)) return nullptr;
  std::ifstream in(path);
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  XLOCO_ENFORCE(!j.is_discarded() && j.is_object(), IoError, "{} is not a JSON object", path);
  XLOCO_ENFORCE(j.contains("vocab_size") && j["vocab_size"].is_number_integer() &&
                    j["vocab_size"].get<int64_t>() > 0,
                IoError, "{} has no positive integer vocab_size", path);
  return j;
}

struct Span {
  int file = 0;
  int64_t begin = 0, len = 0;
};

class TokensDataset : public Dataset {
 public:
  TokensDataset(const common::Config& c, Shard shard) : config_(c), shard_(shard) {
    const auto names = list_token_files(c.data.path);
    XLOCO_ENFORCE(!names.train.empty(), IoError,
                  "data.path {} has no train token files (*train*.bin); make them with `xloco "
                  "prepare --input TEXT --out {}`", c.data.path, c.data.path);
    XLOCO_ENFORCE(!names.val.empty(), IoError,
                  "data.path {} has no validation token files (*val*.bin); `xloco prepare` writes "
                  "them (--val-fraction)", c.data.path);
    const int64_t vocab = c.model.vocab_size > 0 ? c.model.vocab_size : data_vocab_size(c.data);
    XLOCO_ENFORCE(vocab > 0, ConfigError,
                  "data.path {} has neither meta.json nor tokenizer.model: set model.vocab_size "
                  "(50257 for llm.c's GPT-2 shards)", c.data.path);
    const int64_t T = c.model.seq_len;
    XLOCO_ENFORCE(T + 1 <= kTokenBlock, ConfigError,
                  "model.seq_len = {} is over the tokens data set's block of {} tokens", T,
                  kTokenBlock);
    for (const auto& n : names.train) open(n, vocab, train_files_);
    for (const auto& n : names.val) open(n, vocab, val_files_);

    std::vector<Span> blocks;
    for (int f = 0; f < static_cast<int>(train_files_.size()); ++f) {
      const int64_t size = train_files_[f].size();
      for (int64_t b = 0; b < size; b += kTokenBlock) {
        const int64_t len = std::min(kTokenBlock, size - b);
        if (len >= T + 1) blocks.push_back({f, b, len});
      }
    }
    const auto n = static_cast<int64_t>(blocks.size());
    XLOCO_ENFORCE(n >= shard.count, ConfigError,
                  "{} providers is too many for the {} training blocks of {} tokens in {}",
                  shard.count, n, kTokenBlock, c.data.path);
    for (int64_t t = 0; t < n; ++t) {
      const bool mine = c.data.sharding == common::Sharding::kIid
                            ? t % shard.count == shard.index
                            : t * shard.count / n == shard.index;
      if (!mine) continue;
      mine_.push_back(blocks[t]);
      starts_total_ += blocks[t].len - T;
      cum_starts_.push_back(starts_total_);
      train_tokens_ += blocks[t].len;
    }
    for (const auto& f : val_files_) {
      val_starts_total_ += std::max<int64_t>(0, f.size() - T);
      val_tokens_ += f.size();
    }
    XLOCO_ENFORCE(val_starts_total_ > 0, ConfigError,
                  "the validation files of {} hold no window of model.seq_len + 1 = {} tokens",
                  c.data.path, T + 1);
  }

  Batch train_batch(int64_t step, int rank, int world) const override {
    const int64_t T = config_.model.seq_len;
    const int64_t B = config_.inner.batch_size;
    const int64_t b = B / world;
    std::mt19937_64 rng(mix_seed(config_.run.seed, static_cast<uint64_t>(shard_.index),
                                 static_cast<uint64_t>(step), 0x746f6b));
    std::uniform_int_distribution<int64_t> pick(0, starts_total_ - 1);
    std::vector<std::pair<int, int64_t>> windows(static_cast<size_t>(B));
    for (auto& w : windows) {
      const int64_t p = pick(rng);
      const auto i = std::upper_bound(cum_starts_.begin(), cum_starts_.end(), p) - cum_starts_.begin();
      const Span& s = mine_[static_cast<size_t>(i)];
      w = {s.file, s.begin + (p - (cum_starts_[i] - (s.len - T)))};
    }
    return cut(train_files_, {windows.begin() + rank * b, windows.begin() + (rank + 1) * b});
  }

  std::vector<Batch> eval_batches(int rank, int world) const override {
    const int64_t T = config_.model.seq_len;
    const int64_t n = static_cast<int64_t>(config_.inner.eval_batches) * config_.inner.batch_size;
    std::vector<std::pair<int, int64_t>> mine;
    for (int64_t i = rank; i < n; i += world) {
      int64_t p = i * val_starts_total_ / n;
      int f = 0;
      while (p >= std::max<int64_t>(0, val_files_[f].size() - T)) {
        p -= std::max<int64_t>(0, val_files_[f].size() - T);
        ++f;
      }
      mine.push_back({f, p});
    }
    std::vector<Batch> out;
    const auto b = static_cast<size_t>(std::max(1, config_.inner.batch_size / world));
    for (size_t i = 0; i < mine.size(); i += b) {
      out.push_back(cut(val_files_, {mine.begin() + i, mine.begin() + std::min(mine.size(), i + b)}));
    }
    return out;
  }

  std::string describe() const override {
    return fmt::format("tokens shard {}/{} ({}): {} train tokens in {} blocks, {} validation "
                       "tokens, vocabulary {}", shard_.index, shard_.count,
                       common::to_string(config_.data.sharding), train_tokens_, mine_.size(),
                       val_tokens_, data_vocab_size(config_.data));
  }

 private:
  static void open(const std::string& name, int64_t vocab, std::vector<TokenFile>& into) {
    into.emplace_back(name);
    into.back().check_vocab(vocab);
  }

  Batch cut(const std::vector<TokenFile>& files,
            const std::vector<std::pair<int, int64_t>>& windows) const {
    const int64_t T = config_.model.seq_len;
    const auto n = static_cast<int64_t>(windows.size());
    auto w = torch::empty({n, T + 1}, torch::kInt64);
    for (int64_t i = 0; i < n; ++i) {
      files[windows[i].first].copy(windows[i].second, T + 1, w[i].data_ptr<int64_t>());
    }
    Batch batch;
    batch.x = w.narrow(1, 0, T).contiguous();
    batch.y = w.narrow(1, 1, T).contiguous();
    batch.tokens = n * T;
    return batch;
  }

  common::Config config_;
  Shard shard_;
  std::vector<TokenFile> train_files_, val_files_;
  std::vector<Span> mine_;
  std::vector<int64_t> cum_starts_;  // running count of window starts over mine_
  int64_t starts_total_ = 0, val_starts_total_ = 0, train_tokens_ = 0, val_tokens_ = 0;
};

}  // namespace

int64_t data_vocab_size(const common::DataConfig& data) {
  if (data.dataset == common::DatasetKind::kKjv) return 256;
  if (data.dataset != common::DatasetKind::kTokens) return 0;
  XLOCO_ENFORCE(fs::is_directory(data.path), IoError,
                "data.path {} does not exist or is not a directory (expected the folder `xloco "
                "prepare --out` wrote)", data.path);
  const auto meta = read_meta(data.path);
  const auto tokenizer = tokenizer_for(data);
  const int64_t from_meta = meta.is_null() ? 0 : meta["vocab_size"].get<int64_t>();
  if (tokenizer && from_meta > 0) {
    XLOCO_ENFORCE(tokenizer->vocab_size() == from_meta, IoError,
                  "{}/meta.json says vocab_size {} but {}/tokenizer.model has {} pieces: the "
                  "tokenizer does not belong to these token files", data.path, from_meta,
                  data.path, tokenizer->vocab_size());
  }
  return from_meta > 0 ? from_meta : tokenizer ? tokenizer->vocab_size() : 0;
}

void resolve_vocab(common::Config& config) {
  if (config.model.kind != common::ModelKind::kGpt) return;
  const int64_t need = data_vocab_size(config.data);
  if (config.model.vocab_size == 0) {
    XLOCO_ENFORCE(need > 0, ConfigError,
                  "data.path {} has neither meta.json nor tokenizer.model: set model.vocab_size "
                  "(50257 for llm.c's GPT-2 shards)", config.data.path);
    config.model.vocab_size = static_cast<int>(need);
    return;
  }
  XLOCO_ENFORCE(config.model.vocab_size >= need, ConfigError,
                "model.vocab_size = {} is smaller than the data's vocabulary of {} ({}): tokens "
                "at or above {} would have no embedding", config.model.vocab_size, need,
                config.data.dataset == common::DatasetKind::kKjv
                    ? std::string("kjv is byte-level")
                    : config.data.path + "/meta.json or tokenizer.model",
                config.model.vocab_size);
  if (config.model.vocab_size > need && need > 0) {
    spdlog::debug("model.vocab_size {} pads the data's vocabulary of {}", config.model.vocab_size,
                  need);
  }
}

void resolve_module(common::Config& config) {
  auto& m = config.model;
  if (m.kind != common::ModelKind::kTorchScript) return;
  // Absolute, so that a checkpoint's config still finds the module from another directory.
  m.path = std::filesystem::absolute(m.path).lexically_normal().string();
  std::ifstream in(m.path, std::ios::binary);
  XLOCO_ENFORCE(in.good(), ConfigError, "model.path {}: cannot open it (a module saved by "
                "torch.jit.save; see examples/)", m.path);
  m.file_hash = common::file_digest(m.path).second;  // streamed: a GPT-2-sized module is 0.5 GB
}

common::Config load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  auto config = common::load_config(path, overrides);
  resolve_vocab(config);
  resolve_module(config);
  return config;
}

std::unique_ptr<Dataset> make_tokens_dataset(const common::Config& config, Shard shard) {
  return std::make_unique<TokensDataset>(config, shard);
}

}  // namespace xloco::inner
