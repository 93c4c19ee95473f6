// `xloco prepare --input TEXT... --out DIR`: a tokens data directory (tokenizer.model, llm.c
// token files, meta.json) from text files. The work is in src/inner/prepare; this parses,
// prints progress and the summary.
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "inner/prepare.h"

namespace xloco::cli {

void add_prepare_command(CLI::App& app) {
  auto o = std::make_shared<inner::PrepareOptions>();
  auto* cmd = app.add_subcommand(
      "prepare", "tokenize text into a tokens data directory (SentencePiece + llm.c token files)");
  cmd->add_option("--input", o->inputs,
                  "text files or folders (read recursively, in path order; symlinks in folders, "
                  "binary files and duplicates by content are skipped and listed)")
      ->required();
  cmd->add_option("--out", o->out, "the data directory to write (data.path of a tokens run)")
      ->required();
  cmd->add_option("--vocab-size", o->vocab_size,
                  "train a BPE tokenizer with this many pieces (default 8192)")
      ->check(CLI::Range(300, 1 << 20));
  cmd->add_option("--tokenizer", o->tokenizer,
                  "use this SentencePiece tokenizer.model instead of training one")
      ->check(CLI::ExistingFile);
  cmd->add_option("--val-fraction", o->val_fraction, "share of the tokens kept for validation")
      ->check(CLI::Range(0.0, 0.5));
  cmd->add_option("--shard-tokens", o->shard_tokens, "tokens per .bin file")
      ->check(CLI::Range(int64_t{1024}, int64_t{1} << 31));
  cmd->add_option("--threads", o->threads, "encoding threads (0 = all cores)")
      ->check(CLI::Range(0, 1024));
  cmd->add_flag("--overwrite", o->overwrite, "replace an existing --out directory");
  cmd->callback([o]() {
    const auto r = inner::prepare_tokens(*o, [](const std::string& line) {
      if (line.rfind("skipped ", 0) == 0) {
        spdlog::warn("prepare: {}", line);
      } else {
        spdlog::info("prepare: {}", line);
      }
    });
    if (r.train_tokenizer_s > 0) {
      fmt::print("tokenizer: {} pieces trained in {:.1f}s\n", r.vocab_size, r.train_tokenizer_s);
    }
    fmt::print("prepared {}: {:.2f} MB of text -> {} train + {} validation tokens ({:.2f} bytes per "
               "token, round trip byte-exact) in {:.1f}s ({:.2f} MB/s); {} input files read, {} "
               "skipped (listed above); {} token files written\n",
               o->out, r.input_bytes / 1e6, r.train_tokens, r.val_tokens,
               static_cast<double>(r.input_bytes) / std::max<int64_t>(1, r.train_tokens + r.val_tokens),
               r.encode_s, r.input_bytes / 1e6 / std::max(1e-9, r.encode_s), r.inputs.size(),
               r.skipped.size(), r.files.size());
    fmt::print("train on it with data.dataset = \"tokens\", data.path = \"{}\"\n", o->out);
  });
}

}  // namespace xloco::cli
