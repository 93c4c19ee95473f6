#include "inner/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <mutex>

#include "common/error.h"

namespace xloco::inner {
namespace fs = std::filesystem;
using common::IoError;

namespace {

class ByteTokenizer : public Tokenizer {
 public:
  std::vector<uint32_t> encode(const std::string& text) const override {
    std::vector<uint32_t> out(text.size());
    for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<uint8_t>(text[i]);
    return out;
  }
  std::string decode(const std::vector<uint32_t>& ids) const override {
    std::string out;
    out.reserve(ids.size());
    for (uint32_t id : ids) out.push_back(static_cast<char>(id & 0xff));
    return out;
  }
  int64_t vocab_size() const override { return 256; }
  int64_t eos_id() const override { return -1; }
  std::vector<uint8_t> token_bytes() const override { return std::vector<uint8_t>(256, 1); }
  std::string describe() const override { return "bytes (vocabulary 256)"; }
};

// libxloco_spm.so, loaded once (see spm_shim.cpp for why SentencePiece lives in its own module).
struct Spm {
  void* (*load)(const char*, char*, size_t);
  void (*free_processor)(void*);
  int (*piece_size)(void*);
  int (*eos_id)(void*);
  int (*is_control)(void*, int);
  int (*is_byte)(void*, int);
  int (*is_unknown)(void*, int);
  const char* (*id_to_piece)(void*, int);
  long (*encode)(void*, const char*, size_t, int**, char*, size_t);
  long (*train)(const char* const*, size_t, int (*)(void*, const char**, size_t*), void*, char**,
                char*, size_t);
};

std::vector<std::string> spm_candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("XLOCO_SPM_LIB")) out.push_back(env);
  char exe[4096];
  const auto n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) out.push_back((fs::path(std::string(exe, static_cast<size_t>(n))).parent_path() /
                            "libxloco_spm.so").string());
#ifdef XLOCO_SPM_BUILD_PATH
  out.push_back(XLOCO_SPM_BUILD_PATH);
#endif
  out.push_back("libxloco_spm.so");  // the loader's search path (an installed lib directory)
  return out;
}

template <class F>
void bind(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(::dlsym(lib, name));
  XLOCO_ENFORCE(f != nullptr, IoError, "libxloco_spm.so lacks {}", name);
}

const Spm& spm() {
  static std::once_flag once;
  static Spm api{};
  static std::string failure;
  std::call_once(once, [] {
    void* lib = nullptr;
    std::string tried;
    for (const auto& path : spm_candidates()) {
      lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (lib != nullptr) break;
      tried += fmt::format("\n  {}: {}", path, ::dlerror());
    }
    if (lib == nullptr) {
      failure = "cannot load SentencePiece (libxloco_spm.so, built next to the xloco binary; "
                "set XLOCO_SPM_LIB to its path):" + tried;
      return;
    }
    try {
      bind(lib, "xspm_load", api.load);
      bind(lib, "xspm_free", api.free_processor);
      bind(lib, "xspm_piece_size", api.piece_size);
      bind(lib, "xspm_eos_id", api.eos_id);
      bind(lib, "xspm_is_control", api.is_control);
      bind(lib, "xspm_is_byte", api.is_byte);
      bind(lib, "xspm_is_unknown", api.is_unknown);
      bind(lib, "xspm_id_to_piece", api.id_to_piece);
      bind(lib, "xspm_encode", api.encode);
      bind(lib, "xspm_train", api.train);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  });
  XLOCO_ENFORCE(failure.empty(), IoError, "{}", failure);
  return api;
}

// Length of the longest prefix of [p, p + n) that is valid UTF-8 (RFC 3629: no overlongs, no
// surrogates, nothing above U+10FFFF).
size_t valid_utf8_prefix(const unsigned char* p, size_t n) {
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    size_t len;
    unsigned char lo = 0x80, hi = 0xbf;  // the allowed range of the second byte
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return i;
    }
    if (i + len > n || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if (p[i + k] < 0x80 || p[i + k] > 0xbf) return i;
    }
    i += len;
  }
  return n;
}

// Encoding goes through SentencePiece. Decoding is the concatenation of each piece's bytes (its
// text with U+2581 as a space; a byte piece <0xNN> is the raw byte; control pieces nothing): for a
// model without a dummy prefix or normalization (xloco prepare's) that is exactly SentencePiece's
// decode, and unlike it, it gives back bytes that are not UTF-8, which encode() sends to the byte
// pieces one by one.
class SentencePieceTokenizer : public Tokenizer {
 public:
  SentencePieceTokenizer(void* sp, std::string origin) : sp_(sp), origin_(std::move(origin)) {
    static const std::string kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's space
    const int size = spm().piece_size(sp_);
    surface_.resize(static_cast<size_t>(size));
    byte_id_.fill(-1);
    for (int id = 0; id < size; ++id) {
      const std::string piece = spm().id_to_piece(sp_, id);
      if (spm().is_control(sp_, id)) continue;
      if (spm().is_byte(sp_, id)) {  // "<0xNN>"
        const auto b = static_cast<unsigned char>(std::stoi(piece.substr(3, 2), nullptr, 16));
        surface_[id] = std::string(1, static_cast<char>(b));
        byte_id_[b] = id;
        continue;
      }
      if (spm().is_unknown(sp_, id)) {
        surface_[id] = " \xe2\x81\x87 ";  // SentencePiece's rendering of <unk>
        continue;
      }
      std::string text;
      for (size_t at = 0; at < piece.size();) {
        if (piece.compare(at, kSpace.size(), kSpace) == 0) {
          text += ' ';
          at += kSpace.size();
        } else {
          text += piece[at++];
        }
      }
      surface_[id] = std::move(text);
    }
  }
  ~SentencePieceTokenizer() override { spm().free_processor(sp_); }
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

  std::vector<uint32_t> encode(const std::string& text) const override {
    std::vector<uint32_t> out;
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    for (size_t at = 0; at < text.size();) {
      const size_t valid = valid_utf8_prefix(p + at, text.size() - at);
      if (valid > 0) {
        encode_valid(text.data() + at, valid, out);
        at += valid;
        continue;
      }
      XLOCO_ENFORCE(byte_id_[p[at]] >= 0, common::Error,
                    "byte 0x{:02x} is not UTF-8 and the tokenizer {} has no byte fallback piece "
                    "for it", p[at], origin_);
      out.push_back(static_cast<uint32_t>(byte_id_[p[at]]));
      ++at;
    }
    return out;
  }
  std::string decode(const std::vector<uint32_t>& ids) const override {
    std::string out;
    for (uint32_t id : ids) {
      XLOCO_ENFORCE(id < surface_.size(), common::Error,
                    "token {} is outside the vocabulary of {} ({})", id, surface_.size(), origin_);
      out += surface_[id];
    }
    return out;
  }
  int64_t vocab_size() const override { return static_cast<int64_t>(surface_.size()); }
  int64_t eos_id() const override { return spm().eos_id(sp_); }
  std::vector<uint8_t> token_bytes() const override {
    std::vector<uint8_t> out(surface_.size());
    for (size_t id = 0; id < surface_.size(); ++id) {
      out[id] = static_cast<uint8_t>(std::min<size_t>(surface_[id].size(), 255));
    }
    return out;
  }
  std::string describe() const override {
    return fmt::format("SentencePiece {} ({} pieces)", origin_, vocab_size());
  }

 private:
  void encode_valid(const char* text, size_t n, std::vector<uint32_t>& out) const {
    int* ids = nullptr;
    char err[512] = "";
    const long count = spm().encode(sp_, text, n, &ids, err, sizeof err);
    XLOCO_ENFORCE(count >= 0, common::Error, "SentencePiece encode ({}): {}", origin_, err);
    out.insert(out.end(), ids, ids + count);
    std::free(ids);
  }

  void* sp_;
  std::string origin_;
  std::vector<std::string> surface_;  // the bytes each piece decodes to
  std::array<int, 256> byte_id_;      // the byte-fallback piece of each byte, -1 if none
};

struct LineSource {
  const std::function<bool(std::string*)>* next;
  std::string line;
  std::string error;
};

int next_line(void* ctx, const char** data, size_t* size) {
  auto* src = static_cast<LineSource*>(ctx);
  try {
    if (!(*src->next)(&src->line)) return 0;
  } catch (const std::exception& e) {
    src->error = e.what();
    return 0;
  }
  *data = src->line.data();
  *size = src->line.size();
  return 1;
}

}  // namespace

std::unique_ptr<Tokenizer> byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path) {
  XLOCO_ENFORCE(fs::is_regular_file(path), IoError, "tokenizer {} does not exist", path);
  char err[512] = "";
  void* sp = spm().load(path.c_str(), err, sizeof err);
  XLOCO_ENFORCE(sp != nullptr, IoError, "{} is not a SentencePiece model: {}", path, err);
  return std::make_unique<SentencePieceTokenizer>(sp, path);
}

std::string train_sentencepiece(const std::function<bool(std::string*)>& next,
                                int vocab_size) {
  // Identity normalization, no dummy prefix, whitespace kept and byte fallback: decode(encode(x))
  // == x for any bytes (a newline, which training never sees, encodes as the byte <0x0A>).
  const std::vector<std::pair<std::string, std::string>> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"split_digits", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"character_coverage", "0.9995"},
      {"max_sentence_length", "65536"},
      // The model file records the trainer's settings: one fixed value keeps it identical on
      // every machine (SentencePiece's BPE trainer does not use threads anyway).
      {"num_threads", "1"},
      {"minloglevel", "1"},
  };
  std::vector<const char*> flat;
  for (const auto& [k, v] : args) {
    flat.push_back(k.c_str());
    flat.push_back(v.c_str());
  }
  LineSource src{&next, {}, {}};
  char* model = nullptr;
  char err[1024] = "";
  const long n = spm().train(flat.data(), args.size(), next_line, &src, &model, err, sizeof err);
  XLOCO_ENFORCE(src.error.empty(), IoError, "reading the tokenizer's training text: {}", src.error);
  XLOCO_ENFORCE(n >= 0, common::ConfigError,
                "training the SentencePiece tokenizer (vocabulary {}): {}", vocab_size, err);
  std::string out(model, static_cast<size_t>(n));
  std::free(model);
  return out;
}

std::unique_ptr<Tokenizer> tokenizer_for(const common::DataConfig& data) {
  if (data.dataset == common::DatasetKind::kKjv) return byte_tokenizer();
  if (data.dataset != common::DatasetKind::kTokens) return nullptr;
  const std::string path = (fs::path(data.path) / "tokenizer.model").string();
  if (!fs::exists(path)) return nullptr;
  return load_sentencepiece(path);
}

}  // namespace xloco::inner
