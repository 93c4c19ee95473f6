#include "inner/prepare.h"

#include <sodium.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/safetensors.h"
#include "common/text.h"
#include "inner/tokenizer.h"
#include "inner/tokens.h"

namespace xloco::inner {
namespace fs = std::filesystem;
using common::ConfigError;
using common::IoError;
using Clock = std::chrono::steady_clock;

namespace {

// Validation is chosen per block of this many tokens (small, so that a few-MB text still gets an
// evenly spread validation split); the data set deals providers larger blocks (kTokenBlock).
constexpr int64_t kSplitBlock = 8192;
constexpr size_t kReadPiece = 32u << 20;  // text read and encoded per step, cut at a newline
constexpr size_t kEncodeChunk = 256u << 10;  // one thread's unit of work

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string hex(const unsigned char* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += fmt::format("{:02x}", p[i]);
  return s;
}

// Reads a file in pieces that end at a newline (or at the end of the file), hashing as it goes.
class PieceReader {
 public:
  explicit PieceReader(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    XLOCO_ENFORCE(in_.good(), IoError, "cannot open input {}", path);
    crypto_generichash_init(&hash_, nullptr, 0, 16);
  }
  bool next(std::string* piece) {
    if (eof_ && carry_.empty()) return false;
    std::string buf = std::move(carry_);
    carry_.clear();
    if (!eof_) {
      const size_t have = buf.size();
      buf.resize(have + kReadPiece);
      in_.read(buf.data() + have, static_cast<std::streamsize>(kReadPiece));
      const auto got = static_cast<size_t>(in_.gcount());
      XLOCO_ENFORCE(!in_.bad(), IoError, "reading input {} failed", path_);
      buf.resize(have + got);
      crypto_generichash_update(&hash_, reinterpret_cast<const unsigned char*>(buf.data() + have), got);
      bytes_ += got;
      eof_ = got < kReadPiece;
    }
    if (!eof_) {
      const auto nl = buf.rfind('\n');
      if (nl != std::string::npos) {
        carry_ = buf.substr(nl + 1);
        buf.resize(nl + 1);
      }
    }
    *piece = std::move(buf);
    return !piece->empty() || !eof_;
  }
  std::string digest() {
    unsigned char out[16];
    crypto_generichash_final(&hash_, out, sizeof out);
    return hex(out, sizeof out);
  }
  uint64_t bytes() const { return bytes_; }

 private:
  std::string path_;
  std::ifstream in_;
  std::string carry_;
  bool eof_ = false;
  uint64_t bytes_ = 0;
  crypto_generichash_state hash_;
};

// Lines of the inputs for tokenizer training: every `stride`-th non-empty line (deterministic).
class TrainingLines {
 public:
  TrainingLines(std::vector<std::string> files, int64_t stride)
      : files_(std::move(files)), stride_(std::max<int64_t>(1, stride)) {}
  bool next(std::string* line) {
    for (;;) {
      if (!in_.is_open() || !std::getline(in_, *line)) {
        if (in_.is_open()) in_.close();
        if (file_ >= files_.size()) return false;
        in_.open(files_[file_++], std::ios::binary);
        XLOCO_ENFORCE(in_.good(), IoError, "cannot open input {}", files_[file_ - 1]);
        continue;
      }
      if (line->empty() || count_++ % stride_ != 0) continue;
      return true;
    }
  }

 private:
  std::vector<std::string> files_;
  int64_t stride_;
  size_t file_ = 0;
  int64_t count_ = 0;
  std::ifstream in_;
};

// Encodes `text` line by line (each line with its newline) in parallel chunks and checks that
// every chunk decodes back to its bytes. Returns the ids in order.
std::vector<uint32_t> encode_checked(const Tokenizer& tok, const std::string& text, int threads,
                                     const std::string& file, uint64_t file_offset) {
  std::vector<std::pair<size_t, size_t>> chunks;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = std::min(text.size(), begin + kEncodeChunk);
    if (end < text.size()) {
      const auto nl = text.find('\n', end);
      end = nl == std::string::npos ? text.size() : nl + 1;
    }
    chunks.push_back({begin, end});
    begin = end;
  }
  std::vector<std::vector<uint32_t>> out(chunks.size());
  std::vector<std::string> errors(chunks.size());
  std::atomic<size_t> next{0};
  auto work = [&]() {
    for (size_t c; (c = next++) < chunks.size();) {
      try {
        const auto [begin, end] = chunks[c];
        auto& ids = out[c];
        for (size_t b = begin; b < end;) {
          const auto nl = text.find('\n', b);
          const size_t e = nl == std::string::npos || nl >= end ? end : nl + 1;
          const auto line = tok.encode(text.substr(b, e - b));
          ids.insert(ids.end(), line.begin(), line.end());
          b = e;
        }
        const std::string back = tok.decode(ids);
        const std::string_view want(text.data() + begin, end - begin);
        if (back != want) {
          size_t at = 0;
          while (at < back.size() && at < want.size() && back[at] == want[at]) ++at;
          errors[c] = fmt::format(
              "{}: the tokenizer does not reproduce the text from byte offset {} (a tokenizer that "
              "normalizes text or adds a dummy prefix cannot round-trip; train one with "
              "--vocab-size instead)", file, file_offset + begin + at);
        }
      } catch (const std::exception& e) {
        errors[c] = e.what();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  for (const auto& e : errors) XLOCO_ENFORCE(e.empty(), IoError, "{}", e);
  std::vector<uint32_t> all;
  for (const auto& ids : out) all.insert(all.end(), ids.begin(), ids.end());
  return all;
}

// Collects the token stream, sends each kSplitBlock block to train or val and writes a .bin
// file whenever one split holds shard_tokens.
class ShardWriter {
 public:
  ShardWriter(std::string dir, const PrepareOptions& o, int64_t vocab, std::vector<uint8_t> bytes)
      : dir_(std::move(dir)), options_(o), vocab_(vocab), token_bytes_(std::move(bytes)) {}

  void add(const std::vector<uint32_t>& ids) {
    for (size_t i = 0; i < ids.size();) {
      const size_t take = std::min(ids.size() - i, static_cast<size_t>(kSplitBlock) - block_.size());
      block_.insert(block_.end(), ids.begin() + i, ids.begin() + i + take);
      i += take;
      if (static_cast<int64_t>(block_.size()) == kSplitBlock) end_block();
    }
  }

  void finish(PrepareReport& report) {
    if (!block_.empty()) end_block();
    if (val_.tokens == 0 && val_.buf.empty() && options_.val_fraction > 0) {
      XLOCO_ENFORCE(!last_train_block_.empty() && train_.tokens + static_cast<int64_t>(train_.buf.size()) >
                                                      static_cast<int64_t>(last_train_block_.size()),
                    IoError, "the input is too small for a validation split ({} tokens)",
                    train_.tokens + train_.buf.size());
      // Too few blocks for the fraction to pick one: the last block becomes validation.
      train_.buf.resize(train_.buf.size() - last_train_block_.size());
      train_.bytes -= bytes_of(last_train_block_);
      append(val_, last_train_block_);
    }
    flush(train_, "train", true);
    flush(val_, "val", true);
    report.train_tokens = train_.tokens;
    report.val_tokens = val_.tokens;
    report.files = files_;
  }

  nlohmann::json split_json(bool val) const {
    const auto& s = val ? val_ : train_;
    return {{"files", s.names}, {"tokens", s.tokens}, {"bytes", s.bytes}};
  }

 private:
  struct Split {
    std::vector<uint32_t> buf;
    std::vector<std::string> names;
    int64_t tokens = 0, bytes = 0;
  };

  int64_t bytes_of(const std::vector<uint32_t>& ids) const {
    int64_t n = 0;
    for (uint32_t t : ids) n += token_bytes_[t];
    return n;
  }
  void append(Split& s, const std::vector<uint32_t>& ids) {
    s.buf.insert(s.buf.end(), ids.begin(), ids.end());
    s.bytes += bytes_of(ids);
  }
  void end_block() {
    const bool val = is_val_block(blocks_++, options_.val_fraction);
    append(val ? val_ : train_, block_);
    if (!val) last_train_block_ = block_;
    block_.clear();
    flush(train_, "train", false);
    flush(val_, "val", false);
  }
  void flush(Split& s, const char* name, bool last) {
    while (static_cast<int64_t>(s.buf.size()) >= options_.shard_tokens || (last && !s.buf.empty())) {
      const auto n = std::min<size_t>(s.buf.size(), static_cast<size_t>(options_.shard_tokens));
      const std::vector<uint32_t> part(s.buf.begin(), s.buf.begin() + static_cast<int64_t>(n));
      const std::string file = fmt::format("{}_{:06d}.bin", name, s.names.size());
      write_token_file((fs::path(dir_) / file).string(), part, vocab_);
      s.names.push_back(file);
      files_.push_back(file);
      s.tokens += static_cast<int64_t>(n);
      s.buf.erase(s.buf.begin(), s.buf.begin() + static_cast<int64_t>(n));
      if (&s == &train_) last_train_block_.clear();  // written: no longer movable to validation
    }
  }

  std::string dir_;
  const PrepareOptions& options_;
  int64_t vocab_;
  std::vector<uint8_t> token_bytes_;
  std::vector<uint32_t> block_, last_train_block_;
  int64_t blocks_ = 0;
  Split train_, val_;
  std::vector<std::string> files_;
};

}  // namespace

bool is_val_block(int64_t j, double fraction) {
  return std::floor(static_cast<double>(j + 1) * fraction) > std::floor(static_cast<double>(j) * fraction);
}

bool looks_like_text(const std::string& b) {
  // git's rule (a NUL in the first bytes: binary) and `file`'s spirit: text has few control
  // bytes besides \t \n \v \f \r and ESC. Bytes that are not UTF-8 (Latin-1, a cp1252
  // apostrophe) are text still: they round-trip through the tokenizer's byte pieces.
  size_t control = 0;
  for (const char ch : b) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == 0) return false;
    if ((c < 0x20 && !(c >= 0x09 && c <= 0x0d) && c != 0x1b) || c == 0x7f) ++control;
  }
  return control * 10 <= b.size();
}

namespace {

// Why `path` is not text to read, or "" when it is.
std::string not_text_reason(const std::string& path) {
  constexpr size_t kSample = 64 << 10;
  std::ifstream in(path, std::ios::binary);
  XLOCO_ENFORCE(in.good(), IoError, "cannot open input {}", path);
  std::string head(kSample, '\0');
  in.read(head.data(), static_cast<std::streamsize>(kSample));
  head.resize(static_cast<size_t>(in.gcount()));
  if (head.empty()) return "empty";
  return looks_like_text(head) ? ""
                              : "binary (a NUL byte, or over 10 % control bytes, in its first 64 KiB)";
}

}  // namespace

InputList list_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> candidates;
  InputList out;
  for (const auto& in : inputs) {
    XLOCO_ENFORCE(fs::exists(in), IoError, "input {} does not exist", in);
    if (fs::is_directory(in)) {
      std::vector<std::string> found;
      for (const auto& e : fs::recursive_directory_iterator(in)) {
        if (e.is_symlink()) {
          out.skipped.emplace_back(e.path().string(),
                                   "a symlink (name its target as an --input to read it)");
        } else if (e.is_regular_file()) {
          found.push_back(e.path().string());
        }
      }
      std::sort(found.begin(), found.end());
      candidates.insert(candidates.end(), found.begin(), found.end());
    } else {
      candidates.push_back(in);
    }
  }
  // Copies have the same size: only files that share theirs with another are hashed (the
  // encoder reads every file once more; most would otherwise be read twice here).
  std::map<uintmax_t, int> sizes;
  for (const auto& f : candidates) ++sizes[fs::file_size(f)];
  std::map<std::string, std::string> seen;  // digest -> the first file with those bytes
  for (const auto& f : candidates) {
    if (const auto why = not_text_reason(f); !why.empty()) {
      out.skipped.emplace_back(f, why);
      continue;
    }
    if (sizes[fs::file_size(f)] < 2) {
      out.files.push_back(f);
      continue;
    }
    const auto [first, fresh] = seen.emplace(common::file_digest(f).second, f);
    if (!fresh) {
      out.skipped.emplace_back(f, "the same bytes as " + first->second);
      continue;
    }
    out.files.push_back(f);
  }
  XLOCO_ENFORCE(!out.files.empty(), IoError, "no text files in {} ({} skipped)",
                fmt::join(inputs, ", "), out.skipped.size());
  return out;
}

namespace {

PrepareReport prepare_into(const PrepareOptions& o, const std::vector<std::string>& files,
                           const std::string& tmp,
                           const std::function<void(const std::string&)>& progress) {
  const int threads = o.threads > 0 ? o.threads
                                    : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  PrepareReport report;
  int64_t total_bytes = 0;
  for (const auto& f : files) total_bytes += static_cast<int64_t>(fs::file_size(f));

  const std::string model_path = (fs::path(tmp) / "tokenizer.model").string();
  if (!o.tokenizer.empty()) {
    const auto given = load_sentencepiece(o.tokenizer);
    XLOCO_ENFORCE(o.vocab_size == 0 || o.vocab_size == given->vocab_size(), ConfigError,
                  "--vocab-size {} does not match the tokenizer {} ({} pieces); leave "
                  "--vocab-size out to use the tokenizer's", o.vocab_size, o.tokenizer,
                  given->vocab_size());
    fs::copy_file(o.tokenizer, model_path);
  } else {
    const int vocab = o.vocab_size > 0 ? o.vocab_size : 8192;
    const auto t0 = Clock::now();
    if (progress) progress(fmt::format("training a {}-piece BPE tokenizer on {:.1f} MB", vocab,
                                       std::min(total_bytes, o.train_sample_bytes) / 1e6));
    TrainingLines lines(files, (total_bytes + o.train_sample_bytes - 1) / o.train_sample_bytes);
    common::write_file_atomic(
        model_path, train_sentencepiece([&](std::string* l) { return lines.next(l); }, vocab));
    report.train_tokenizer_s = seconds_since(t0);
  }
  const auto tok = load_sentencepiece(model_path);
  report.vocab_size = tok->vocab_size();

  const auto t0 = Clock::now();
  auto last_report = t0;
  ShardWriter writer(tmp, o, report.vocab_size, tok->token_bytes());
  nlohmann::json sources = nlohmann::json::array();
  int64_t done = 0;
  for (const auto& f : files) {
    PieceReader reader(f);
    std::string piece;
    uint64_t offset = 0;
    while (reader.next(&piece)) {
      writer.add(encode_checked(*tok, piece, threads, f, offset));
      offset += piece.size();
      done += static_cast<int64_t>(piece.size());
      if (progress && seconds_since(last_report) >= 1.0) {
        last_report = Clock::now();
        const double rate = done / std::max(1e-9, seconds_since(t0));
        progress(fmt::format("encoded {:.1f} of {:.1f} MB | {:.1f} MB/s | ETA {:.0f}s", done / 1e6,
                             total_bytes / 1e6, rate / 1e6, (total_bytes - done) / rate));
      }
    }
    if (tok->eos_id() >= 0) writer.add({static_cast<uint32_t>(tok->eos_id())});
    sources.push_back({{"path", f}, {"bytes", reader.bytes()}, {"blake2b", reader.digest()}});
  }
  writer.finish(report);
  report.input_bytes = done;
  report.encode_s = seconds_since(t0);

  const nlohmann::ordered_json meta = {
      {"format", "llm.c token files (256 x int32 header, uint16 tokens; uint32 above 65536)"},
      {"vocab_size", report.vocab_size},
      {"tokenizer", "tokenizer.model"},
      {"tokenizer_source", o.tokenizer.empty() ? std::string("trained by xloco prepare") : o.tokenizer},
      {"eos_id", tok->eos_id()},
      {"split_block_tokens", kSplitBlock},
      {"val_fraction", o.val_fraction},
      {"train", writer.split_json(false)},
      {"val", writer.split_json(true)},
      {"sources", sources},
  };
  common::write_file_atomic((fs::path(tmp) / "meta.json").string(), meta.dump(1) + "\n");
  return report;
}

}  // namespace

PrepareReport prepare_tokens(const PrepareOptions& o,
                             const std::function<void(const std::string&)>& progress) {
  XLOCO_ENFORCE(sodium_init() >= 0, common::Error, "libsodium failed to initialise");
  XLOCO_ENFORCE(o.val_fraction >= 0 && o.val_fraction < 1, ConfigError,
                "--val-fraction {} must be in [0, 1)", o.val_fraction);
  XLOCO_ENFORCE(o.shard_tokens > 0, ConfigError, "shard size {} must be positive", o.shard_tokens);
  const auto listed = list_inputs(o.inputs);
  for (const auto& [path, why] : listed.skipped) {
    if (progress) progress(fmt::format("skipped {}: {}", common::printable(path, 1024), why));
  }
  const auto& files = listed.files;
  XLOCO_ENFORCE(o.overwrite || !fs::exists(o.out), ConfigError,
                "{} already exists; pass --overwrite to replace it", o.out);
  const std::string tmp = o.out + ".tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  PrepareReport report;
  try {
    report = prepare_into(o, files, tmp, progress);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);  // a failed preparation leaves nothing behind
    throw;
  }
  report.inputs = files;
  report.skipped = listed.skipped;
  if (fs::exists(o.out)) fs::remove_all(o.out);
  fs::rename(tmp, o.out);
  common::fsync_dir(fs::absolute(o.out).parent_path().string());
  return report;
}

}  // namespace xloco::inner
