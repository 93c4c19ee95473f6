#include "common/checkpoint.h"

#include <fcntl.h>
#include <sodium.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "common/json_text.h"
#include "common/text.h"

namespace xloco::common {
namespace fs = std::filesystem;
namespace {

// Size and 16-byte BLAKE2b of bytes as they are written.
struct Digest {
  crypto_generichash_state st;
  uint64_t bytes = 0;
  Digest() { crypto_generichash_init(&st, nullptr, 0, 16); }
  void add(const uint8_t* p, size_t n) {
    crypto_generichash_update(&st, p, static_cast<unsigned long long>(n));
    bytes += n;
  }
  nlohmann::json entry() {
    unsigned char out[16];
    crypto_generichash_final(&st, out, sizeof out);
    std::string hex;
    for (const unsigned char c : out) hex += fmt::format("{:02x}", c);
    return {{"bytes", bytes}, {"blake2b", hex}};
  }
};

bool is_checkpoint_name(const std::string& n) { return !n.empty() && n[0] != '.'; }

}  // namespace

std::pair<uint64_t, std::string> file_digest(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  XLOCO_ENFORCE(fd >= 0, IoError, "cannot open {}: {}", path.string(), std::strerror(errno));
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, 16);
  std::vector<unsigned char> buf(1 << 20);
  uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw IoError(fmt::format("cannot read {}: {}", path.string(), std::strerror(err)));
    }
    if (n == 0) break;
    crypto_generichash_update(&st, buf.data(), static_cast<unsigned long long>(n));
    total += static_cast<uint64_t>(n);
  }
  ::close(fd);
  unsigned char out[16];
  crypto_generichash_final(&st, out, sizeof out);
  std::string hex;
  for (const unsigned char c : out) hex += fmt::format("{:02x}", c);
  return {total, hex};
}

std::string write_checkpoint(const std::string& root, const std::string& name,
                             const CheckpointContents& contents, int keep) {
  const fs::path final_dir = fs::path(root) / name;
  const std::string pid = std::to_string(::getpid());
  const fs::path tmp = fs::path(root) / (".tmp-" + name + "-" + pid);
  const fs::path old = fs::path(root) / (".old-" + name + "-" + pid);
  try {
    fs::create_directories(root);
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    nlohmann::json manifest = nlohmann::json::object();
    // Hashed as written: a second pass over a model-sized file would double the disk time.
    for (const auto& [file, tensors] : contents.files) {
      Digest d;
      write_safetensors((tmp / file).string(), tensors, {{"format", "pt"}},
                        [&d](const uint8_t* p, size_t n) { d.add(p, n); });
      manifest[file] = d.entry();
    }
    const std::string state = json_dump(contents.state, 2) + "\n";
    write_file_atomic((tmp / "state.json").string(), state);
    Digest d;
    d.add(reinterpret_cast<const uint8_t*>(state.data()), state.size());
    manifest["state.json"] = d.entry();
    write_file_atomic((tmp / kManifestFile).string(), json_dump(manifest, 2) + "\n");
    fsync_dir(tmp.string());
    // The good copy of NAME (a checkpoint of the same round, re-written) goes aside, not away,
    // until the new one has its name.
    if (fs::exists(final_dir)) fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    fsync_dir(root);
    fs::remove_all(old);
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    if (!fs::exists(final_dir, ec) && fs::exists(old, ec)) fs::rename(old, final_dir, ec);
    throw IoError(fmt::format("checkpoint {} under {} not written: {}", name, root, e.what()));
  }
  write_file_atomic((fs::path(root) / "latest").string(), name + "\n");
  if (keep > 0) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(root)) {
      const auto n = e.path().filename().string();
      if (e.is_directory() && is_checkpoint_name(n)) names.push_back(n);
    }
    std::sort(names.begin(), names.end());
    for (size_t i = 0; i + static_cast<size_t>(keep) < names.size(); ++i) {
      if (names[i] != name) fs::remove_all(fs::path(root) / names[i]);
    }
  }
  return final_dir.string();
}

std::optional<std::string> verify_checkpoint(const std::string& dir, bool* legacy) {
  if (legacy) *legacy = false;
  const fs::path d(dir);
  const fs::path manifest_path = d / kManifestFile;
  if (!fs::exists(manifest_path)) {
    if (fs::exists(d / "state.json")) {
      // Written before manifests: nothing to verify against.
      if (legacy) *legacy = true;
      return std::nullopt;
    }
    return fmt::format("no {} (an interrupted write)", kManifestFile);
  }
  std::ifstream in(manifest_path);
  const auto manifest = nlohmann::json::parse(in, nullptr, false);
  if (manifest.is_discarded() || !manifest.is_object() || manifest.empty()) {
    return fmt::format("{} is not a JSON object of files", kManifestFile);
  }
  // Every field is checked for its type before it is read: a manifest of any content gives a
  // reason (and the caller falls back), never an exception.
  for (auto it = manifest.begin(); it != manifest.end(); ++it) {
    const std::string name = printable(it.key(), 128);
    if (name != it.key() || it.key().find('/') != std::string::npos || it.key() == ".." ||
        !it->is_object()) {
      return fmt::format("{} lists a bad entry \"{}\"", kManifestFile, name);
    }
    const auto bytes_field = it->find("bytes");
    const auto hash_field = it->find("blake2b");
    if (bytes_field == it->end() || !bytes_field->is_number_unsigned() || hash_field == it->end() ||
        !hash_field->is_string()) {
      return fmt::format("{} gives {} no byte count and hash", kManifestFile, name);
    }
    const fs::path file = d / it.key();
    if (!fs::exists(file)) return fmt::format("{} is missing", name);
    try {
      const auto [bytes, hash] = file_digest(file);
      if (bytes != bytes_field->get<uint64_t>()) {
        return fmt::format("{} has {} bytes, the manifest says {}", name, bytes,
                           bytes_field->get<uint64_t>());
      }
      if (hash != hash_field->get<std::string>()) {
        return fmt::format("{} does not match its hash in the manifest (corrupted)", name);
      }
    } catch (const std::exception& e) {
      return printable(e.what(), 512);
    }
  }
  return std::nullopt;
}

std::vector<std::string> checkpoint_candidates(const std::string& root) {
  std::vector<std::string> names;
  if (!fs::is_directory(root)) return names;
  for (const auto& e : fs::directory_iterator(root)) {
    const auto n = e.path().filename().string();
    if (!e.is_directory() || !is_checkpoint_name(n)) continue;
    if (fs::exists(e.path() / "state.json") || fs::exists(e.path() / kManifestFile)) {
      names.push_back(n);
    }
  }
  // Names sort by round (or step): the newest first. `latest` is for humans and other tools;
  // a crash between a checkpoint's rename and `latest`'s update must not hide it.
  std::sort(names.rbegin(), names.rend());
  std::vector<std::string> out;
  for (const auto& n : names) out.push_back((fs::path(root) / n).string());
  return out;
}

std::optional<std::string> latest_checkpoint(const std::string& root,
                                             std::vector<std::string>* skipped) {
  for (const auto& dir : checkpoint_candidates(root)) {
    const auto problem = verify_checkpoint(dir);
    if (!problem) return dir;
    if (skipped) skipped->push_back(dir + ": " + *problem);
  }
  return std::nullopt;
}

std::vector<std::string> remove_stale_temp(const std::string& root) {
  std::vector<std::string> removed;
  if (!fs::is_directory(root)) return removed;
  for (const auto& e : fs::directory_iterator(root)) {
    const auto n = e.path().filename().string();
    if (n.rfind(".tmp-", 0) == 0 || n.rfind(".old-", 0) == 0 || n == "latest.tmp") {
      std::error_code ec;
      fs::remove_all(e.path(), ec);
      XLOCO_ENFORCE(!ec, IoError, "cannot remove stale {}: {}", e.path().string(), ec.message());
      removed.push_back(n);
    }
  }
  return removed;
}

void check_writable(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  XLOCO_ENFORCE(!ec, IoError, "cannot create directory {}: {}", dir, ec.message());
  const std::string probe = (fs::path(dir) / (".write-probe-" + std::to_string(::getpid()))).string();
  try {
    write_file_atomic(probe, "xloco\n");
  } catch (const IoError& e) {
    throw IoError(fmt::format("directory {} is not writable: {}", dir, e.what()));
  }
  fs::remove(probe, ec);
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
