#include "inner/data.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>

#include <torch/torch.h>

#include "common/error.h"
#include "common/safetensors.h"

namespace xloco::inner {
namespace fs = std::filesystem;
using common::IoError;

uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (uint64_t v : {a, b, c, d}) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
  }
  return h;
}

// ---------------------------------------------------------------- KJV

std::string strip_verse_references(const std::string& raw) {
  static const std::regex ref(R"(^[0-9]?[A-Za-z]+[0-9]+:[0-9]+ )");
  std::string out;
  out.reserve(raw.size());
  std::istringstream in(raw);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, ref)) line = m.suffix().str();
    out += line;
    out += '\n';
  }
  return out;
}

static std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  XLOCO_ENFORCE(in.good(), IoError, "cannot open {}", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string load_kjv_text(const common::DataConfig& data) {
  if (!data.path.empty()) return read_whole(data.path);
  std::string dir = data.cache_dir;
  if (dir.empty()) {
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    dir = xdg ? std::string(xdg) + "/xloco" : std::string(home ? home : "/tmp") + "/.cache/xloco";
  }
  const std::string cached = dir + "/kjv.txt";
  if (fs::exists(cached) && fs::file_size(cached) > 4000000) return read_whole(cached);
  XLOCO_ENFORCE(fs::exists("/usr/bin/bible"), IoError,
                "the KJV text needs Debian's bible-kjv package (/usr/bin/bible is missing): "
                "run `make setup` or `apt-get install bible-kjv`");
  std::FILE* pipe = ::popen("/usr/bin/bible -f \"Gen1:1-Rev22:21\" 2>/dev/null", "r");
  XLOCO_ENFORCE(pipe != nullptr, IoError, "cannot run /usr/bin/bible");
  std::string raw;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) raw.append(buf, n);
  const int rc = ::pclose(pipe);
  XLOCO_ENFORCE(rc == 0 && raw.size() > 4000000, IoError,
                "`bible -f Gen1:1-Rev22:21` failed (exit {}, {} bytes)", rc, raw.size());
  std::string text = strip_verse_references(raw);
  fs::create_directories(dir);
  common::write_file_atomic(cached, text);
  return text;
}

std::vector<int64_t> kjv_val_blocks(int64_t n_bytes) {
  std::vector<int64_t> out;
  const int64_t blocks = (n_bytes + kKjvBlock - 1) / kKjvBlock;
  for (int64_t j = 0; j < blocks; ++j) {
    if (j % 20 == 19) out.push_back(j);
  }
  return out;
}

std::vector<int64_t> kjv_train_blocks(int64_t n_bytes, Shard shard, common::Sharding sharding) {
  std::vector<int64_t> train;
  const int64_t blocks = (n_bytes + kKjvBlock - 1) / kKjvBlock;
  for (int64_t j = 0; j < blocks; ++j) {
    if (j % 20 != 19) train.push_back(j);
  }
  std::vector<int64_t> out;
  const int64_t n = static_cast<int64_t>(train.size());
  for (int64_t t = 0; t < n; ++t) {
    const bool mine = sharding != common::Sharding::kIid ? (t * shard.count / n) == shard.index
                                          : t % shard.count == shard.index;
    if (mine) out.push_back(train[t]);
  }
  return out;
}

namespace {

std::vector<uint8_t> gather_blocks(const std::string& text, const std::vector<int64_t>& blocks) {
  std::vector<uint8_t> out;
  for (int64_t j : blocks) {
    const int64_t begin = j * kKjvBlock;
    const int64_t end = std::min<int64_t>(begin + kKjvBlock, static_cast<int64_t>(text.size()));
    out.insert(out.end(), text.begin() + begin, text.begin() + end);
  }
  return out;
}

class KjvDataset : public Dataset {
 public:
  KjvDataset(const common::Config& c, Shard shard) : config_(c), shard_(shard) {
    const std::string text = load_kjv_text(c.data);
    const auto n = static_cast<int64_t>(text.size());
    XLOCO_ENFORCE(shard.count <= n / kKjvBlock / 2, common::ConfigError,
                  "{} providers is too many for the {} training blocks of KJV", shard.count,
                  n / kKjvBlock);
    const auto train = gather_blocks(text, kjv_train_blocks(n, shard, c.data.sharding));
    const auto val = gather_blocks(text, kjv_val_blocks(n));
    // Kept as bytes (1 B per token, not 8): windows are widened to int64 when a batch is cut.
    train_ = torch::from_blob(const_cast<uint8_t*>(train.data()), {(int64_t)train.size()},
                              torch::kUInt8).clone();
    val_ = torch::from_blob(const_cast<uint8_t*>(val.data()), {(int64_t)val.size()},
                            torch::kUInt8).clone();
  }

  Batch train_batch(int64_t step, int rank, int world) const override {
    const int64_t T = config_.model.seq_len;
    const int64_t B = config_.inner.batch_size;
    const int64_t b = B / world;
    std::mt19937_64 rng(mix_seed(config_.run.seed, static_cast<uint64_t>(shard_.index),
                                 static_cast<uint64_t>(step), 0x6b6a76));
    std::uniform_int_distribution<int64_t> pick(0, train_.size(0) - T - 2);
    std::vector<int64_t> starts(static_cast<size_t>(B));
    for (auto& s : starts) s = pick(rng);
    return windows(train_, std::vector<int64_t>(starts.begin() + rank * b,
                                                starts.begin() + (rank + 1) * b));
  }

  std::vector<Batch> eval_batches(int rank, int world) const override {
    const int64_t T = config_.model.seq_len;
    const int64_t n = static_cast<int64_t>(config_.inner.eval_batches) * config_.inner.batch_size;
    const int64_t span = val_.size(0) - T - 1;
    std::vector<int64_t> mine;
    for (int64_t i = rank; i < n; i += world) mine.push_back(i * span / n);
    std::vector<Batch> out;
    const int64_t b = std::max<int64_t>(1, config_.inner.batch_size / world);
    for (size_t i = 0; i < mine.size(); i += static_cast<size_t>(b)) {
      const size_t end = std::min(mine.size(), i + static_cast<size_t>(b));
      out.push_back(windows(val_, std::vector<int64_t>(mine.begin() + i, mine.begin() + end)));
    }
    return out;
  }

  std::string describe() const override {
    return fmt::format("kjv shard {}/{} ({}): {} train bytes, {} validation bytes",
                       shard_.index, shard_.count, common::to_string(config_.data.sharding), train_.size(0),
                       val_.size(0));
  }

 private:
  Batch windows(const torch::Tensor& stream, const std::vector<int64_t>& starts) const {
    const int64_t T = config_.model.seq_len;
    auto idx = torch::tensor(starts, torch::kInt64).unsqueeze(1) + torch::arange(T + 1).unsqueeze(0);
    auto w = stream.index_select(0, idx.flatten()).view({(int64_t)starts.size(), T + 1})
                 .to(torch::kInt64);
    Batch b;
    b.x = w.narrow(1, 0, T).contiguous();
    b.y = w.narrow(1, 1, T).contiguous();
    b.tokens = static_cast<int64_t>(starts.size()) * T;
    return b;
  }

  common::Config config_;
  Shard shard_;
  torch::Tensor train_, val_;
};

// ---------------------------------------------------------------- Fashion-MNIST

class FmnistDataset : public Dataset {
 public:
  FmnistDataset(const common::Config& c, Shard shard) : config_(c), shard_(shard) {
    const std::string dir = c.data.path.empty() ? default_fmnist_dir() : c.data.path;
    auto train_x = read_idx(dir + "/train-images-idx3-ubyte.gz");
    auto train_y = read_idx(dir + "/train-labels-idx1-ubyte.gz");
    auto test_x = read_idx(dir + "/t10k-images-idx3-ubyte.gz");
    auto test_y = read_idx(dir + "/t10k-labels-idx1-ubyte.gz");
    check_pair(train_x, train_y, "train");
    check_pair(test_x, test_y, "t10k");
    const auto idx = fmnist_shard(train_y.data, shard, c.data.sharding, c.data.dirichlet_alpha,
                                  c.run.seed);
    XLOCO_ENFORCE(!idx.empty(), common::ConfigError,
                  "fmnist shard {}/{} is empty; raise data.dirichlet_alpha", shard.index,
                  shard.count);
    auto all_x = images(train_x);
    auto all_y = labels(train_y);
    auto sel = torch::tensor(idx, torch::kInt64);
    train_x_ = all_x.index_select(0, sel);
    train_y_ = all_y.index_select(0, sel);
    val_x_ = images(test_x);
    val_y_ = labels(test_y);
  }

  Batch train_batch(int64_t step, int rank, int world) const override {
    const int64_t B = config_.inner.batch_size;
    const int64_t b = B / world;
    std::mt19937_64 rng(mix_seed(config_.run.seed, static_cast<uint64_t>(shard_.index),
                                 static_cast<uint64_t>(step), 0x666d));
    std::uniform_int_distribution<int64_t> pick(0, train_x_.size(0) - 1);
    std::vector<int64_t> all(static_cast<size_t>(B));
    for (auto& s : all) s = pick(rng);
    auto sel = torch::tensor(std::vector<int64_t>(all.begin() + rank * b,
                                                  all.begin() + (rank + 1) * b), torch::kInt64);
    return {train_x_.index_select(0, sel), train_y_.index_select(0, sel), b};
  }

  std::vector<Batch> eval_batches(int rank, int world) const override {
    const int64_t n = std::min<int64_t>(
        static_cast<int64_t>(config_.inner.eval_batches) * config_.inner.batch_size,
        val_x_.size(0));
    std::vector<int64_t> mine;
    for (int64_t i = rank; i < n; i += world) mine.push_back(i * val_x_.size(0) / n);
    std::vector<Batch> out;
    const size_t b = static_cast<size_t>(std::max(1, config_.inner.batch_size / world));
    for (size_t i = 0; i < mine.size(); i += b) {
      auto sel = torch::tensor(std::vector<int64_t>(mine.begin() + i,
                                                    mine.begin() + std::min(mine.size(), i + b)),
                               torch::kInt64);
      out.push_back({val_x_.index_select(0, sel), val_y_.index_select(0, sel), sel.size(0)});
    }
    return out;
  }

  std::string describe() const override {
    return fmt::format("fmnist shard {}/{} ({}): {} train images, {} test images", shard_.index,
                       shard_.count, common::to_string(config_.data.sharding), train_x_.size(0), val_x_.size(0));
  }

 private:
  static void check_pair(const Idx& x, const Idx& y, const char* which) {
    XLOCO_ENFORCE(x.dims.size() == 3 && x.dims[1] == 28 && x.dims[2] == 28 &&
                      y.dims.size() == 1 && y.dims[0] == x.dims[0],
                  IoError, "fashion-mnist {} files have unexpected shapes", which);
    for (uint8_t l : y.data) XLOCO_ENFORCE(l < 10, IoError, "fashion-mnist label {} >= 10", l);
  }
  static torch::Tensor images(const Idx& x) {
    auto t = torch::from_blob(const_cast<uint8_t*>(x.data.data()), {x.dims[0], 1, 28, 28},
                              torch::kUInt8).to(torch::kFloat32);
    return (t / 255.0 - kFmnistMean) / kFmnistStd;
  }
  static torch::Tensor labels(const Idx& y) {
    return torch::from_blob(const_cast<uint8_t*>(y.data.data()), {y.dims[0]}, torch::kUInt8)
        .to(torch::kInt64);
  }

  common::Config config_;
  Shard shard_;
  torch::Tensor train_x_, train_y_, val_x_, val_y_;
};

}  // namespace

std::string default_fmnist_dir() { return "/usr/share/datasets/fashion-mnist"; }

Idx read_idx(const std::string& path) {
  gzFile f = ::gzopen(path.c_str(), "rb");
  XLOCO_ENFORCE(f != nullptr, IoError,
                "cannot open {} (Fashion-MNIST comes with Debian's dataset-fashion-mnist)", path);
  auto read_exact = [&](void* dst, size_t n) {
    const int got = ::gzread(f, dst, static_cast<unsigned>(n));
    return got == static_cast<int>(n);
  };
  unsigned char magic[4];
  Idx idx;
  try {
    XLOCO_ENFORCE(read_exact(magic, 4), IoError, "{}: truncated IDX header", path);
    XLOCO_ENFORCE(magic[0] == 0 && magic[1] == 0 && magic[2] == 0x08 && magic[3] >= 1 &&
                      magic[3] <= 4,
                  IoError, "{}: not an unsigned-byte IDX file (magic {:02x}{:02x}{:02x}{:02x})",
                  path, magic[0], magic[1], magic[2], magic[3]);
    uint64_t total = 1;
    for (int i = 0; i < magic[3]; ++i) {
      unsigned char d[4];
      XLOCO_ENFORCE(read_exact(d, 4), IoError, "{}: truncated IDX dimensions", path);
      const int64_t dim = (int64_t(d[0]) << 24) | (d[1] << 16) | (d[2] << 8) | d[3];
      idx.dims.push_back(dim);
      total *= static_cast<uint64_t>(dim);
      XLOCO_ENFORCE(total <= (1ull << 32), IoError, "{}: IDX declares {} bytes, over 4 GiB",
                    path, total);
    }
    idx.data.resize(total);
    XLOCO_ENFORCE(read_exact(idx.data.data(), total), IoError,
                  "{}: truncated IDX data (expected {} bytes)", path, total);
  } catch (...) {
    ::gzclose(f);
    throw;
  }
  ::gzclose(f);
  return idx;
}

std::vector<int64_t> fmnist_shard(const std::vector<uint8_t>& labels, Shard shard,
                                  common::Sharding sharding, double alpha, uint64_t seed) {
  const auto n = static_cast<int64_t>(labels.size());
  std::vector<int64_t> out;
  std::mt19937_64 rng(mix_seed(seed, 0x73686172));  // the same on every provider
  if (sharding != common::Sharding::kDirichlet) {
    std::vector<int64_t> perm(static_cast<size_t>(n));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t i = shard.index; i < n; i += shard.count) out.push_back(perm[i]);
    std::sort(out.begin(), out.end());
    return out;
  }
  for (int cls = 0; cls < 10; ++cls) {
    std::vector<int64_t> members;
    for (int64_t i = 0; i < n; ++i) {
      if (labels[i] == cls) members.push_back(i);
    }
    std::shuffle(members.begin(), members.end(), rng);
    std::gamma_distribution<double> gamma(alpha, 1.0);
    std::vector<double> p(static_cast<size_t>(shard.count));
    double sum = 0;
    for (auto& v : p) sum += (v = gamma(rng) + 1e-12);
    double cum = 0;
    for (int k = 0; k < shard.count; ++k) {
      const auto begin = static_cast<int64_t>(cum / sum * members.size());
      cum += p[k];
      const auto end = k + 1 == shard.count ? static_cast<int64_t>(members.size())
                                            : static_cast<int64_t>(cum / sum * members.size());
      if (k == shard.index) out.insert(out.end(), members.begin() + begin, members.begin() + end);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::unique_ptr<Dataset> make_dataset(const common::Config& config, Shard shard) {
  if (config.data.dataset == common::DatasetKind::kKjv) return std::make_unique<KjvDataset>(config, shard);
  if (config.data.dataset == common::DatasetKind::kTokens) return make_tokens_dataset(config, shard);
  return std::make_unique<FmnistDataset>(config, shard);
}

}  // namespace xloco::inner
