// Tokenizers of a run's text: bytes (KJV: token = byte value, vocabulary 256) or a SentencePiece
// model (`tokenizer.model`, trained by `xloco prepare` or brought by the user). SentencePiece's
// headers stay in tokenizer.cpp. Owns encode/decode and training; not the token files.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"

namespace xloco::inner {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<uint32_t> encode(const std::string& text) const = 0;
  // Control tokens (bos, eos) decode to nothing.
  virtual std::string decode(const std::vector<uint32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  // The end-of-document token put between input files, or -1 when the tokenizer has none.
  virtual int64_t eos_id() const = 0;
  // Bytes each token decodes to (0 for control tokens): tokens × loss / Σ bytes = nats per byte.
  virtual std::vector<uint8_t> token_bytes() const = 0;
  virtual std::string describe() const = 0;
};

std::unique_ptr<Tokenizer> byte_tokenizer();
// Loads a SentencePiece model file; throws IoError naming the file when it is not one.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path);

// Trains a SentencePiece BPE model on the lines `next_line` yields (false at the end) and returns
// the serialized model (the bytes of a tokenizer.model). Byte fallback is on, normalization and
// whitespace handling are off, so decode(encode(text)) == text for every byte string.
// Deterministic: the same lines give the same model.
std::string train_sentencepiece(const std::function<bool(std::string*)>& next_line,
                                int vocab_size);

// The tokenizer a run's samples and evals decode with: bytes for kjv, DIR/tokenizer.model for
// the tokens data set; nullptr when a tokens directory has none (llm.c shards made elsewhere).
std::unique_ptr<Tokenizer> tokenizer_for(const common::DataConfig& data);

}  // namespace xloco::inner
