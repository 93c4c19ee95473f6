// Data sets of design §4 and their sharding across providers and ranks: KJV bytes (from
// Debian's bible-kjv) and token files (`xloco prepare`, llm.c's format) for the gpt model,
// Fashion-MNIST (Debian's dataset-fashion-mnist) for the cnn. Every batch is a pure function of (seed, provider, step, rank), so a resumed run sees
// exactly the batches an uninterrupted one would, and R ranks split exactly one provider batch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "common/config.h"

namespace xloco::inner {

struct Shard {
  int index = 0;  // this provider, 0..count-1
  int count = 1;  // providers in the run
};

struct Batch {
  torch::Tensor x;         // gpt: [b, T] int64 bytes; cnn: [b, 1, 28, 28] float
  torch::Tensor y;         // gpt: [b, T] int64 next bytes; cnn: [b] int64 labels
  int64_t tokens = 0;      // gpt: b*T; cnn: b (samples)
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  // Rank `rank`'s slice of provider batch `step` (batch_size examples split over `world`).
  virtual Batch train_batch(int64_t step, int rank, int world) const = 0;
  // The fixed validation set (eval_batches × batch_size examples), dealt round-robin to ranks.
  virtual std::vector<Batch> eval_batches(int rank, int world) const = 0;
  virtual std::string describe() const = 0;
};

std::unique_ptr<Dataset> make_dataset(const common::Config& config, Shard shard);

// The vocabulary the data needs: 256 for kjv, DIR/meta.json's (or DIR/tokenizer.model's) for
// tokens, 0 when unknown (llm.c shards without either) or not a text data set. Throws IoError
// naming both files when meta.json and tokenizer.model disagree.
int64_t data_vocab_size(const common::DataConfig& data);
// Fills model.vocab_size from the data when it is 0; refuses one smaller than the data's
// vocabulary (ConfigError naming the file). Call right after loading a config, so the config
// hash the head and its providers compare covers the vocabulary.
void resolve_vocab(common::Config& config);
// torchscript models: makes model.path absolute and fills model.file_hash (BLAKE2b of the
// module's bytes), so that the head refuses a provider holding another module.
void resolve_module(common::Config& config);
// load_config, then resolve_vocab and resolve_module.
common::Config load_run_config(const std::string& path, const std::vector<std::string>& overrides);

// The tokens data set (tokens_data.cpp): windows from memory-mapped train files, 16 Ki-token
// blocks dealt to providers; validation windows evenly spaced over the val files.
constexpr int64_t kTokenBlock = 16 * 1024;
std::unique_ptr<Dataset> make_tokens_dataset(const common::Config& config, Shard shard);

// --- exposed for tests and tools -------------------------------------------------------------
constexpr int64_t kKjvBlock = 64 * 1024;
// The whole KJV text with verse references stripped (cached under data.cache_dir).
std::string load_kjv_text(const common::DataConfig& data);
// Strips the leading "Ge1:1 " reference of each line.
std::string strip_verse_references(const std::string& raw);
// Indices of the 64 KiB blocks of an n-byte stream that go to `shard` (validation blocks,
// j % 20 == 19, never do): `iid` deals training blocks round-robin, `books` in contiguous runs.
std::vector<int64_t> kjv_train_blocks(int64_t n_bytes, Shard shard, common::Sharding sharding);
std::vector<int64_t> kjv_val_blocks(int64_t n_bytes);

struct Idx {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};
// Reads a gzip-compressed (or plain) IDX file; throws IoError naming the file on any defect.
Idx read_idx(const std::string& path);
// Sample indices of `labels` that go to `shard`: iid (seeded permutation) or dirichlet(alpha)
// label skew. Disjoint across shards and deterministic in seed.
std::vector<int64_t> fmnist_shard(const std::vector<uint8_t>& labels, Shard shard,
                                  common::Sharding sharding, double alpha, uint64_t seed);
std::string default_fmnist_dir();
// The normalisation of every Fashion-MNIST image the data set gives: (pixel/255 − mean) / std.
constexpr double kFmnistMean = 0.2860, kFmnistStd = 0.3530;

// A 64-bit seed mixing its parts (splitmix64), for per-(seed, provider, step) generators.
uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c = 0, uint64_t d = 0);

}  // namespace xloco::inner
