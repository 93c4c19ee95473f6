// safetensors reader and writer (the format of huggingface/safetensors: an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}},
// then the raw little-endian data). Torch-free: tensors are (dtype, shape, bytes) so that
// files load in Python with any safetensors reader. Writes are atomic (temp file, fsync, rename).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace xloco::common {

struct TensorBlob {
  std::string name;
  std::string dtype;  // "F32", "F64", "I64", "BF16", "U8", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // little-endian, row-major
  // Borrowed bytes instead of `data` (writing only): checkpoints of large models stream
  // straight from the parameter buffers instead of copying them first.
  const uint8_t* borrowed = nullptr;
  size_t borrowed_size = 0;

  const uint8_t* bytes() const { return borrowed ? borrowed : data.data(); }
  size_t size() const { return borrowed ? borrowed_size : data.size(); }
};

struct SafetensorsFile {
  std::vector<TensorBlob> tensors;  // in file order
  std::map<std::string, std::string> metadata;
  const TensorBlob* find(const std::string& name) const;
};

size_t dtype_size(const std::string& dtype);  // throws IoError for an unknown dtype

// `observe`, when given, sees every byte written, in order (checkpoints hash files as they
// write them instead of reading them back).
void write_safetensors(const std::string& path, const std::vector<TensorBlob>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       const std::function<void(const uint8_t*, size_t)>& observe = {});
// Validates the header (sizes, offsets within the file, dtype × shape == byte length) and throws
// IoError naming the file and the tensor on any inconsistency.
SafetensorsFile read_safetensors(const std::string& path);

// Writes `bytes` to `path` via a temp file in the same directory, fsync and rename.
void write_file_atomic(const std::string& path, const std::string& bytes);
void fsync_dir(const std::string& dir);
// Writes all `n` bytes to `fd` (retrying short writes); throws IoError naming `path`.
void write_all(int fd, const void* data, size_t n, const std::string& path);

}  // namespace xloco::common
