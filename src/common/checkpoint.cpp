#include "common/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "common/error.h"

namespace xloco::common {
namespace fs = std::filesystem;

std::string write_checkpoint(const std::string& root, const std::string& name,
                             const CheckpointContents& contents, int keep) {
  fs::create_directories(root);
  const fs::path final_dir = fs::path(root) / name;
  const fs::path tmp = fs::path(root) / (".tmp-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  for (const auto& [file, tensors] : contents.files) {
    write_safetensors((tmp / file).string(), tensors, {{"format", "pt"}});
  }
  write_file_atomic((tmp / "state.json").string(), contents.state.dump(2) + "\n");
  fsync_dir(tmp.string());
  if (fs::exists(final_dir)) fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);
  fsync_dir(root);
  write_file_atomic((fs::path(root) / "latest").string(), name + "\n");
  if (keep > 0) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(root)) {
      const auto n = e.path().filename().string();
      if (e.is_directory() && n[0] != '.') names.push_back(n);
    }
    std::sort(names.begin(), names.end());
    for (size_t i = 0; i + static_cast<size_t>(keep) < names.size(); ++i) {
      if (names[i] != name) fs::remove_all(fs::path(root) / names[i]);
    }
  }
  return final_dir.string();
}

std::optional<std::string> latest_checkpoint(const std::string& root) {
  if (!fs::is_directory(root)) return std::nullopt;
  std::ifstream in(fs::path(root) / "latest");
  std::string name;
  if (in >> name) {
    const fs::path dir = fs::path(root) / name;
    if (fs::exists(dir / "state.json")) return dir.string();
  }
  // `latest` missing or pointing at a removed directory: fall back to the newest complete one.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root)) {
    const auto n = e.path().filename().string();
    if (e.is_directory() && n[0] != '.' && fs::exists(e.path() / "state.json")) names.push_back(n);
  }
  if (names.empty()) return std::nullopt;
  std::sort(names.begin(), names.end());
  return (fs::path(root) / names.back()).string();
}

nlohmann::json read_checkpoint_state(const std::string& dir) {
  const auto path = (fs::path(dir) / "state.json").string();
  std::ifstream in(path);
  XLOCO_ENFORCE(in.good(), IoError, "checkpoint {} has no state.json", dir);
  auto j = nlohmann::json::parse(in, nullptr, false);
  XLOCO_ENFORCE(!j.is_discarded() && j.is_object(), IoError, "{} is not a JSON object", path);
  return j;
}

}  // namespace xloco::common
