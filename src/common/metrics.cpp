#include "common/metrics.h"
#include "common/json_text.h"

#include <fcntl.h>
#include <sodium.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/safetensors.h"

namespace xloco::common {

void JsonlWriter::open(const std::string& path) {
  if (fd_ >= 0) ::close(fd_);
  path_ = path;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  XLOCO_ENFORCE(fd_ >= 0, IoError, "cannot open metrics file {}: {}", path, std::strerror(errno));
}

JsonlWriter::~JsonlWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void JsonlWriter::write(const nlohmann::json& record) {
  if (fd_ < 0) return;
  const std::string line = json_dump(record) + "\n";
  const off_t end = ::lseek(fd_, 0, SEEK_END);
  try {
    write_all(fd_, line.data(), line.size(), path_);
  } catch (const IoError& e) {
    if (end >= 0) (void)::ftruncate(fd_, end);  // no torn line for the next one to follow
    throw IoError(fmt::format("cannot write metrics: {}", e.what()));
  }
}

std::string human_rate(double v) {
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.1f}k", v / 1e3);
  return fmt::format("{:.0f}", v);
}

std::string human_bytes(double b) {
  if (b >= 1e9) return fmt::format("{:.2f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.2f} MB", b / 1e6);
  if (b >= 1e3) return fmt::format("{:.1f} kB", b / 1e3);
  return fmt::format("{:.0f} B", b);
}

std::string human_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, static_cast<int>((t % 3600) / 60));
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, static_cast<int>(t % 60));
  return fmt::format("{}s", t);
}

int64_t peak_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  int64_t kb = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
  }
  std::fclose(f);
  return kb * 1024;
}

std::string hash_hex(const void* data, size_t size) {
  unsigned char out[16];
  crypto_generichash(out, sizeof(out), static_cast<const unsigned char*>(data), size, nullptr, 0);
  std::string hex;
  for (unsigned char c : out) hex += fmt::format("{:02x}", c);
  return hex;
}

}  // namespace xloco::common
