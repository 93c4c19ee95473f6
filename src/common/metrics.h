// Metrics sink: one JSON object per line, written through per line so that a crash loses at
// most the line being written, and a line that fails (a full disk) is cut back off the file, so
// that writing it again later leaves no torn line. Also the small formatting helpers the progress lines share.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace xloco::common {

class JsonlWriter {
 public:
  JsonlWriter() = default;
  explicit JsonlWriter(const std::string& path) { open(path); }
  void open(const std::string& path);  // appends; creates parent directories
  ~JsonlWriter();
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;
  void write(const nlohmann::json& record);
  bool is_open() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
  std::string path_;
};

std::string human_rate(double per_second);   // 8.1k, 1.2M
std::string human_bytes(double bytes);       // 1.2 MB
std::string human_duration(double seconds);  // 3m12s

// This process's peak resident set size (VmHWM), 0 when unknown.
int64_t peak_rss_bytes();

// 16-byte BLAKE2b of a byte range, hex: parameter hashes compared across ranks and replicas.
std::string hash_hex(const void* data, size_t size);

}  // namespace xloco::common
