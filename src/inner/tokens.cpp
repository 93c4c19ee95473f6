#include "inner/tokens.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/error.h"
#include "common/safetensors.h"

namespace xloco::inner {
namespace fs = std::filesystem;
using common::IoError;

namespace {

void put_le32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

int32_t get_le32(const uint8_t* p) {
  return static_cast<int32_t>(uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 |
                              uint32_t(p[3]) << 24);
}

}  // namespace

void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens,
                      int64_t vocab_size) {
  XLOCO_ENFORCE(tokens.size() < (1ull << 31), IoError,
                "{}: {} tokens is over the format's 2^31 limit per file", path, tokens.size());
  const bool wide = vocab_size > 65536;
  std::string out;
  out.reserve(static_cast<size_t>(kTokensHeaderBytes) + tokens.size() * (wide ? 4 : 2));
  put_le32(out, static_cast<uint32_t>(wide ? kTokensMagic32 : kTokensMagic16));
  put_le32(out, static_cast<uint32_t>(wide ? kTokensVersion32 : kTokensVersion16));
  put_le32(out, static_cast<uint32_t>(tokens.size()));
  out.append(static_cast<size_t>(kTokensHeaderBytes) - 12, '\0');
  for (uint32_t t : tokens) {
    XLOCO_ENFORCE(t < static_cast<uint64_t>(vocab_size), IoError,
                  "{}: token {} is outside the vocabulary of {}", path, t, vocab_size);
    out.push_back(static_cast<char>(t & 0xff));
    out.push_back(static_cast<char>((t >> 8) & 0xff));
    if (wide) {
      out.push_back(static_cast<char>((t >> 16) & 0xff));
      out.push_back(static_cast<char>((t >> 24) & 0xff));
    }
  }
  common::write_file_atomic(path, out);
}

TokenFile::TokenFile(std::string path) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  XLOCO_ENFORCE(fd >= 0, IoError, "cannot open token file {}: {}", path_, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw IoError(fmt::format("cannot stat token file {}: {}", path_, std::strerror(err)));
  }
  map_size_ = static_cast<size_t>(st.st_size);
  if (map_size_ < static_cast<size_t>(kTokensHeaderBytes)) {
    ::close(fd);
    throw IoError(fmt::format(
        "token file {} is {} bytes, shorter than llm.c's 1024-byte header (truncated, or not a "
        "token file)", path_, map_size_));
  }
  map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  XLOCO_ENFORCE(map_ != MAP_FAILED, IoError, "cannot map token file {}: {}", path_,
                std::strerror(err));
  // Windows are drawn at random offsets: read-ahead would only pull in pages nobody uses.
  ::madvise(map_, map_size_, MADV_RANDOM);
  const auto* bytes = static_cast<const uint8_t*>(map_);
  const int32_t magic = get_le32(bytes), version = get_le32(bytes + 4), count = get_le32(bytes + 8);
  try {
    if (magic == kTokensMagic16) {
      XLOCO_ENFORCE(version == kTokensVersion16, IoError,
                    "token file {}: version {} at byte offset 4; llm.c's uint16 format is "
                    "version {}", path_, version, kTokensVersion16);
      width_ = 2;
    } else if (magic == kTokensMagic32) {
      XLOCO_ENFORCE(version == kTokensVersion32, IoError,
                    "token file {}: version {} at byte offset 4; llm.c's uint32 format is "
                    "version {}", path_, version, kTokensVersion32);
      width_ = 4;
    } else {
      throw IoError(fmt::format(
          "token file {}: bad magic {} at byte offset 0 (llm.c's token files start with {} or "
          "{}; a nanoGPT train.bin without a header is not supported: rewrite it with `xloco "
          "prepare` or llm.c's write_datafile)", path_, magic, kTokensMagic16, kTokensMagic32));
    }
    XLOCO_ENFORCE(count >= 0, IoError, "token file {}: negative token count {} at byte offset 8",
                  path_, count);
    count_ = count;
    const size_t want = static_cast<size_t>(kTokensHeaderBytes) +
                        static_cast<size_t>(count_) * static_cast<size_t>(width_);
    XLOCO_ENFORCE(map_size_ >= want, IoError,
                  "token file {} is truncated: the header declares {} tokens ({} bytes), the file "
                  "ends at byte offset {}", path_, count_, want, map_size_);
    XLOCO_ENFORCE(map_size_ == want, IoError,
                  "token file {}: {} bytes after the {} tokens the header declares (from byte "
                  "offset {})", path_, map_size_ - want, count_, want);
  } catch (...) {
    ::munmap(map_, map_size_);
    throw;
  }
  body_ = bytes + kTokensHeaderBytes;
}

TokenFile::~TokenFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

TokenFile::TokenFile(TokenFile&& o) noexcept
    : path_(std::move(o.path_)), map_(o.map_), map_size_(o.map_size_), body_(o.body_),
      count_(o.count_), width_(o.width_) {
  o.map_ = nullptr;
  o.body_ = nullptr;
  o.count_ = 0;
}

void TokenFile::copy(int64_t begin, int64_t n, int64_t* out) const {
  if (width_ == 2) {
    const auto* p = reinterpret_cast<const uint16_t*>(body_) + begin;
    for (int64_t i = 0; i < n; ++i) out[i] = p[i];
  } else {
    const auto* p = reinterpret_cast<const uint32_t*>(body_) + begin;
    for (int64_t i = 0; i < n; ++i) out[i] = p[i];
  }
}

namespace {
template <class T>
uint32_t max_of(const T* p, int64_t n) {
  T m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, p[i]);  // vectorizes: a max reduction
  return m;
}
}  // namespace

uint32_t TokenFile::max_token() const {
  return width_ == 2 ? max_of(reinterpret_cast<const uint16_t*>(body_), count_)
                     : max_of(reinterpret_cast<const uint32_t*>(body_), count_);
}

void TokenFile::check_vocab(int64_t vocab_size) const {
  if (static_cast<int64_t>(max_token()) < vocab_size) return;
  for (int64_t i = 0; i < count_; ++i) {
    if (static_cast<int64_t>(at(i)) >= vocab_size) {
      throw IoError(fmt::format(
          "token file {}: token {} at byte offset {} (token index {}) is outside the vocabulary "
          "of {} (model.vocab_size, or the tokenizer's size in meta.json)", path_, at(i),
          kTokensHeaderBytes + i * width_, i, vocab_size));
    }
  }
}

TokenFileNames list_token_files(const std::string& dir) {
  XLOCO_ENFORCE(fs::is_directory(dir), IoError,
                "data.path {} is not a directory (expected the output of `xloco prepare`, or a "
                "folder of llm.c token files)", dir);
  TokenFileNames out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto name = e.path().filename().string();
    if (!e.is_regular_file() || e.path().extension() != ".bin") continue;
    if (name.find("train") != std::string::npos) {
      out.train.push_back(e.path().string());
    } else if (name.find("val") != std::string::npos) {
      out.val.push_back(e.path().string());
    }
  }
  std::sort(out.train.begin(), out.train.end());
  std::sort(out.val.begin(), out.val.end());
  return out;
}

}  // namespace xloco::inner
