// Checkpoint directories: ROOT/NAME/ holding safetensors files and state.json, written to a
// temp directory, fsynced and renamed into place, then ROOT/latest names the newest. A crash at
// any point leaves either the previous checkpoint or the new one, never a half-written one
// named by `latest`.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/safetensors.h"

namespace xloco::common {

struct CheckpointContents {
  std::map<std::string, std::vector<TensorBlob>> files;  // "model.safetensors" -> tensors
  nlohmann::json state;                                   // written as state.json
};

// Writes ROOT/NAME atomically, updates ROOT/latest, removes all but the newest `keep`
// (0 = keep all). Returns the checkpoint's path.
std::string write_checkpoint(const std::string& root, const std::string& name,
                             const CheckpointContents& contents, int keep = 0);

// The directory `latest` names, when it is complete (state.json present); otherwise the newest
// complete one; nullopt when there is none.
std::optional<std::string> latest_checkpoint(const std::string& root);

// Reads DIR/state.json; throws IoError naming the path.
nlohmann::json read_checkpoint_state(const std::string& dir);

}  // namespace xloco::common
