// Checkpoints other tools read and write: a Hugging Face GPT-2 directory (transformers'
// GPT2LMHeadModel parameter names, Conv1D weights stored transposed as [in, out], config.json,
// the tokenizer) out of an xloco checkpoint, and warm-start weights in from such a directory or
// from a nanoGPT-named safetensors file. Owns the name and layout mapping, not training.
#pragma once

#include <string>

#include "common/safetensors.h"

namespace xloco::inner {

struct HfExportOptions {
  std::string checkpoint;  // an xloco checkpoint directory (train or head)
  std::string out;         // the directory to write
  std::string tokenizer;   // tokenizer.model to ship ("" = the run's data.path/tokenizer.model)
  bool overwrite = false;
};

// Writes OUT/model.safetensors, OUT/config.json and, for a SentencePiece run,
// OUT/tokenizer.model with tokenizer_config.json and special_tokens_map.json. Returns a line
// describing what was written.
std::string export_hf(const HfExportOptions& options);

// Warm-start weights under xloco's (nanoGPT's) names, F32: from an xloco checkpoint directory,
// a Hugging Face GPT-2 directory (config.json with model_type gpt2 + model.safetensors, names with
// or without the "transformer." prefix), or a nanoGPT-named .safetensors file. The tied
// lm_head.weight and attention-mask buffers are dropped. Throws IoError naming the path.
common::SafetensorsFile load_init_weights(const std::string& path);

// True when `name` is one of GPT-2's Conv1D weights (stored [in, out] by transformers).
bool is_conv1d_weight(const std::string& name);

}  // namespace xloco::inner
