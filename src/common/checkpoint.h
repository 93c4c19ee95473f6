// Checkpoint directories: ROOT/NAME/ holding safetensors files, state.json and MANIFEST.json
// (every other file's size and BLAKE2b), written to a temp directory, fsynced and renamed into
// place, then ROOT/latest names the newest. A crash at any point leaves the previous
// checkpoint or the new one, never a half-written one named by `latest`: re-writing NAME moves
// the old copy aside first and removes it only once the new one is in place. A checkpoint is
// complete when its MANIFEST.json is there and every file matches it; readers fall back to the
// newest complete one and say why they skipped the others.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/safetensors.h"

namespace xloco::common {

struct CheckpointContents {
  std::map<std::string, std::vector<TensorBlob>> files;  // "model.safetensors" -> tensors
  nlohmann::json state;                                   // written as state.json
};

inline constexpr const char* kManifestFile = "MANIFEST.json";

// Writes ROOT/NAME atomically, updates ROOT/latest, removes all but the newest `keep`
// (0 = keep all). Returns the checkpoint's path. On failure (a full disk, an unwritable
// directory) it throws IoError naming the path and leaves no temp directory and every earlier
// checkpoint as it was.
std::string write_checkpoint(const std::string& root, const std::string& name,
                             const CheckpointContents& contents, int keep = 0);

// What is wrong with checkpoint DIR: no manifest, a file missing, of another size or another
// hash. nullopt when it is complete. A directory written before manifests existed (state.json,
// no MANIFEST.json) is accepted unverified (`legacy` set).
std::optional<std::string> verify_checkpoint(const std::string& dir, bool* legacy = nullptr);

// Checkpoint directories under ROOT that hold a state.json or a manifest, newest first (by
// name, descending: names carry the round or step). Complete or not: verify each.
std::vector<std::string> checkpoint_candidates(const std::string& root);

// The newest complete checkpoint (verify_checkpoint), nullopt when there is none. `skipped`,
// when given, receives "DIR: why" for each newer one passed over.
std::optional<std::string> latest_checkpoint(const std::string& root,
                                             std::vector<std::string>* skipped = nullptr);

// Removes what an interrupted write_checkpoint leaves under ROOT (.tmp-* and .old-*
// directories, a torn `latest.tmp`); returns their names. For the one process that writes ROOT,
// at its start.
std::vector<std::string> remove_stale_temp(const std::string& root);

// Creates DIR if needed and proves a file can be written, fsynced and removed there; throws
// IoError naming DIR and the reason (read-only, no space, permissions).
void check_writable(const std::string& dir);

// Size and 16-byte BLAKE2b (hex) of a file, read in 1 MiB pieces; IoError naming the path.
std::pair<uint64_t, std::string> file_digest(const std::filesystem::path& path);

// Reads DIR/state.json; throws IoError naming the path.
nlohmann::json read_checkpoint_state(const std::string& dir);

}  // namespace xloco::common
