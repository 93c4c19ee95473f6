#include "common/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/text.h"

namespace xloco::common {
namespace {

constexpr uint64_t kMaxHeader = 100u << 20;  // the reference implementation's limit

}  // namespace

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    XLOCO_ENFORCE(w > 0, IoError, "write {}: {}", path, std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

const TensorBlob* SafetensorsFile::find(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

size_t dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
      {"I16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"U64", 8}, {"U32", 4}};
  auto it = sizes.find(dtype);
  XLOCO_ENFORCE(it != sizes.end(), IoError, "safetensors: unknown dtype \"{}\"", printable(dtype, 32));
  return it->second;
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  XLOCO_ENFORCE(fd >= 0, IoError, "cannot open directory {} to fsync it: {}", dir,
                std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // EINVAL: a file system that cannot sync directories (nothing to do there).
  XLOCO_ENFORCE(rc == 0 || err == EINVAL, IoError, "fsync of directory {}: {}", dir,
                std::strerror(err));
}

namespace {

// Temp file in the same directory, `fill` writes it, fsync, rename, fsync the directory: a
// crash leaves the old file or the new one, never a torn one.
template <class Fill>
void write_atomically(const std::string& path, Fill&& fill) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  XLOCO_ENFORCE(fd >= 0, IoError, "cannot create {}: {}", tmp, std::strerror(errno));
  try {
    fill([&](const void* data, size_t n) { write_all(fd, data, n, tmp); });
    XLOCO_ENFORCE(::fsync(fd) == 0, IoError, "fsync {}: {}", tmp, std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw IoError(fmt::format("close {}: {}", tmp, std::strerror(err)));
  }
  XLOCO_ENFORCE(::rename(tmp.c_str(), path.c_str()) == 0, IoError, "rename {} -> {}: {}", tmp,
                path, std::strerror(errno));
  fsync_dir(std::filesystem::path(path).parent_path().string());
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  write_atomically(path, [&](auto&& put) { put(bytes.data(), bytes.size()); });
}

void write_safetensors(const std::string& path, const std::vector<TensorBlob>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const std::function<void(const uint8_t*, size_t)>& observe) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    int64_t numel = 1;
    for (auto d : t.shape) numel *= d;
    XLOCO_ENFORCE(static_cast<uint64_t>(numel) * dtype_size(t.dtype) == t.size(), IoError,
                  "safetensors: tensor {} has {} bytes, shape needs {}", t.name, t.size(),
                  numel * dtype_size(t.dtype));
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.size()}}};
    offset += t.size();
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // align the data section to 8 bytes
  std::string head;
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) head.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  head += h;
  // Streamed from the tensors' own memory: no second copy of a model in RAM.
  write_atomically(path, [&](auto&& put) {
    put(head.data(), head.size());
    if (observe) observe(reinterpret_cast<const uint8_t*>(head.data()), head.size());
    for (const auto& t : tensors) {
      put(t.bytes(), t.size());
      if (observe) observe(t.bytes(), t.size());
    }
  });
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  XLOCO_ENFORCE(in.good(), IoError, "cannot open {}", path);
  in.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  XLOCO_ENFORCE(size >= 8, IoError, "{}: truncated ({} bytes), not a safetensors file", path, size);
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= static_cast<uint64_t>(len_bytes[i]) << (8 * i);
  XLOCO_ENFORCE(hlen <= kMaxHeader && hlen <= size - 8, IoError,
                "{}: header length {} exceeds the file ({} bytes) or the 100 MiB limit", path,
                hlen, size);
  std::string h(hlen, '\0');
  in.read(h.data(), static_cast<std::streamsize>(hlen));
  auto header = nlohmann::json::parse(h, nullptr, false);
  XLOCO_ENFORCE(!header.is_discarded() && header.is_object(), IoError,
                "{}: header is not a JSON object", path);
  const uint64_t data_size = size - 8 - hlen;
  SafetensorsFile file;
  struct Entry {
    uint64_t begin, end;
    TensorBlob blob;
  };
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      XLOCO_ENFORCE(it->is_object(), IoError, "{}: __metadata__ is not an object", path);
      for (auto m = it->begin(); m != it->end(); ++m) {
        XLOCO_ENFORCE(m->is_string(), IoError, "{}: metadata {} is not a string", path, printable(m.key(), 64));
        file.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const auto& v = *it;
    XLOCO_ENFORCE(v.is_object() && v.contains("dtype") && v["dtype"].is_string() &&
                      v.contains("shape") && v["shape"].is_array() &&
                      v.contains("data_offsets") && v["data_offsets"].is_array() &&
                      v["data_offsets"].size() == 2 && v["data_offsets"][0].is_number_unsigned() &&
                      v["data_offsets"][1].is_number_unsigned(),
                  IoError, "{}: tensor {} has a malformed header entry", path, printable(it.key(), 200));
    Entry e;
    e.blob.name = printable(it.key(), 200);  // a file's bytes: quoted escaped from here on
    XLOCO_ENFORCE(e.blob.name == it.key(), IoError, "{}: tensor name {} is not printable ASCII", path,
                  e.blob.name);
    e.blob.dtype = v["dtype"].get<std::string>();
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      XLOCO_ENFORCE(d.is_number_unsigned() && d.get<uint64_t>() < (1ull << 40), IoError,
                    "{}: tensor {} has a bad dimension", path, e.blob.name);
      e.blob.shape.push_back(d.get<int64_t>());
      numel *= d.get<uint64_t>();
      XLOCO_ENFORCE(numel < (1ull << 40), IoError, "{}: tensor {} is too large", path, e.blob.name);
    }
    e.begin = v["data_offsets"][0].get<uint64_t>();
    e.end = v["data_offsets"][1].get<uint64_t>();
    XLOCO_ENFORCE(e.begin <= e.end && e.end <= data_size, IoError,
                  "{}: tensor {} data_offsets [{}, {}] outside the {} data bytes", path,
                  e.blob.name, e.begin, e.end, data_size);
    XLOCO_ENFORCE(numel * dtype_size(e.blob.dtype) == e.end - e.begin, IoError,
                  "{}: tensor {} has {} bytes but dtype {} x shape needs {}", path, e.blob.name,
                  e.end - e.begin, e.blob.dtype, numel * dtype_size(e.blob.dtype));
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  // As the reference implementation requires: the tensors tile the data section, each one
  // starting where the one before ends and the last ending at the file's end, so that no byte
  // is read twice (overlapping entries would let a small file allocate without bound).
  uint64_t at = 0;
  for (const auto& e : entries) {
    XLOCO_ENFORCE(e.begin == at, IoError,
                  "{}: tensor {} data_offsets [{}, {}] {} (the data must be contiguous, in "
                  "offset order, without overlaps)",
                  path, e.blob.name, e.begin, e.end,
                  e.begin < at ? fmt::format("overlap the tensor before, which ends at {}", at)
                               : fmt::format("leave a gap after byte {}", at));
    at = e.end;
  }
  XLOCO_ENFORCE(at == data_size, IoError, "{}: the tensors end at data byte {}, the file's data section holds {}",
                path, at, data_size);
  for (auto& e : entries) {
    e.blob.data.resize(e.end - e.begin);
    in.seekg(static_cast<std::streamoff>(8 + hlen + e.begin));
    in.read(reinterpret_cast<char*>(e.blob.data.data()), static_cast<std::streamsize>(e.blob.data.size()));
    XLOCO_ENFORCE(in.good(), IoError, "{}: short read in tensor {}", path, e.blob.name);
    file.tensors.push_back(std::move(e.blob));
  }
  return file;
}

}  // namespace xloco::common
