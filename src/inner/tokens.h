// Token files in llm.c's format (karpathy/llm.c dev/data/data_common.py): a header of 256
// little-endian int32 (magic, version, token count, then zeros) followed by the tokens, uint16
// (magic 20240520, version 1: GPT-2-sized vocabularies) or uint32 (magic 20240801, version 7).
// Files are memory-mapped read-only, never loaded whole. Owns the format, not the data set.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace xloco::inner {

constexpr int32_t kTokensMagic16 = 20240520;
constexpr int32_t kTokensVersion16 = 1;
constexpr int32_t kTokensMagic32 = 20240801;
constexpr int32_t kTokensVersion32 = 7;
constexpr int64_t kTokensHeaderBytes = 256 * 4;

// Writes `tokens` to `path` (temp file, fsync, rename): uint16 when every token fits (vocab
// ≤ 65536), else the uint32 variant.
void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens,
                      int64_t vocab_size);

// A read-only mapping of one token file. Construction checks the header and the file size and
// throws IoError naming the file (and the byte offset) on a bad magic, version or a truncated or
// overlong body.
class TokenFile {
 public:
  explicit TokenFile(std::string path);
  ~TokenFile();
  TokenFile(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  TokenFile& operator=(TokenFile&&) = delete;

  int64_t size() const { return count_; }
  int bytes_per_token() const { return width_; }
  const std::string& path() const { return path_; }
  uint32_t at(int64_t i) const {
    return width_ == 2 ? reinterpret_cast<const uint16_t*>(body_)[i]
                       : reinterpret_cast<const uint32_t*>(body_)[i];
  }
  // Copies tokens [begin, begin + n) widened to int64.
  void copy(int64_t begin, int64_t n, int64_t* out) const;
  // The largest token (0 for an empty file); reads the whole body once.
  uint32_t max_token() const;
  // Throws IoError naming the file and the byte offset of the first token >= vocab_size.
  void check_vocab(int64_t vocab_size) const;

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* body_ = nullptr;
  int64_t count_ = 0;
  int width_ = 2;
};

// The train and validation token files of a prepared directory, sorted by name: files whose name
// contains "train" / "val" and ends in ".bin" (xloco prepare writes train_000000.bin, …; llm.c's
// scripts write NAME_train_000001.bin and NAME_val_000000.bin).
struct TokenFileNames {
  std::vector<std::string> train, val;
};
TokenFileNames list_token_files(const std::string& dir);

}  // namespace xloco::inner
