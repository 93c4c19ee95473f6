// `xloco prepare`: text files in, a tokens data directory out — tokenizer.model (trained here, or
// the user's), train_NNNNNN.bin and val_NNNNNN.bin in llm.c's token-file format, and meta.json.
// Every chunk is decoded again and compared with its text before it is written, so a directory
// that exists decodes byte-exactly to its input. Deterministic: the same input gives the same
// bytes. Writes go to OUT.tmp, renamed to OUT at the end.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace xloco::inner {

struct PrepareOptions {
  std::vector<std::string> inputs;    // files or folders (walked recursively, sorted by path)
  std::string out;                    // the data directory to create
  int vocab_size = 0;                 // trained tokenizer's vocabulary (0 = 8192; with `tokenizer`: must match)
  std::string tokenizer;              // an existing SentencePiece tokenizer.model to use instead
  double val_fraction = 0.05;         // share of 64 Ki-token blocks that go to validation
  int64_t shard_tokens = 100'000'000; // tokens per .bin file (llm.c writes 10^8)
  int64_t train_sample_bytes = 256ll << 20;  // tokenizer training reads at most this much text
  int threads = 0;                    // encoding threads; 0 = hardware concurrency
  bool overwrite = false;             // replace an existing OUT
};

struct PrepareReport {
  int64_t input_bytes = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  int64_t vocab_size = 0;
  double train_tokenizer_s = 0;  // 0 when a tokenizer was given
  double encode_s = 0;           // encoding, round-trip check and writing shards
  std::vector<std::string> files;  // written token files
  std::vector<std::string> inputs;  // text files read, in order
  std::vector<std::pair<std::string, std::string>> skipped;  // path, why it was not read
};

// Runs the whole preparation; `progress` gets one line at most every second while encoding.
PrepareReport prepare_tokens(const PrepareOptions& options,
                             const std::function<void(const std::string&)>& progress = {});

// The text files of `inputs`: each file named, and each folder's regular files recursively,
// sorted by path. Not read (each with the reason): a symlink found in a folder (it would read its
// target twice, or text from outside the folder), a binary file (an index, an archive, a .dat:
// looks_like_text false on its first 64 KiB), an empty file, and a file whose bytes equal an
// earlier one's (a copy would put the same text in train and validation). Throws IoError naming
// a path that does not exist, or when no text file is left.
struct InputList {
  std::vector<std::string> files;
  std::vector<std::pair<std::string, std::string>> skipped;  // path, reason
};
InputList list_inputs(const std::vector<std::string>& inputs);

// Whether `bytes` (a file's first bytes) look like text: no NUL byte and at most 10 % control
// bytes other than \t \n \v \f \r and ESC. Text in other encodings than UTF-8 counts as text.
bool looks_like_text(const std::string& bytes);

// Whether 64 Ki-token block `j` goes to validation: val blocks are spread evenly, the share
// `fraction` of them (j is a val block when floor((j+1)·f) > floor(j·f)).
bool is_val_block(int64_t j, double fraction);

}  // namespace xloco::inner
