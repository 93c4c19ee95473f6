#include "compress/frame.h"

#include <zstd.h>

#include <cstring>
#include <limits>

#include "common/text.h"
#include "compress/error.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the wire format is little-endian");

namespace xloco::compress {
namespace {

// A tensor name from a frame is a peer's bytes: quoted escaped and bounded (design §10).
std::string quote(const std::string& name) { return common::printable(name, 96); }

// Smallest table entry: u16 name_len, u8 rank, u64 offset, u64 bytes.
constexpr uint64_t kMinEntryBytes = 2 + 1 + 8 + 8;

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
uint8_t* store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
  return p + sizeof(T);
}

// Reads the table. The frame's total size was checked against the header first, so running
// past the declared table end means the sizes disagree (kCorrupt), not that bytes are missing.
class TableReader {
 public:
  TableReader(const uint8_t* frame, uint64_t begin, uint64_t end)
      : frame_(frame), pos_(begin), end_(end) {}

  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    const T v = load<T>(frame_ + pos_);
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(uint64_t n, const char* what) {
    need(n, what);
    std::string s(reinterpret_cast<const char*>(frame_ + pos_), n);
    pos_ += n;
    return s;
  }

  uint64_t pos() const { return pos_; }
  uint64_t end() const { return end_; }

 private:
  void need(uint64_t n, const char* what) const {
    XLOCO_FRAME_ENFORCE(end_ - pos_ >= n, kCorrupt,
                        "tensor table: {} at offset {} runs past the table end at {}", what, pos_,
                        end_);
  }

  const uint8_t* frame_;
  uint64_t pos_;
  uint64_t end_;
};

TensorEntry read_entry(TableReader& table, uint64_t index, uint64_t expected_offset,
                       const FrameInfo& info, const Limits& limits) {
  TensorEntry e;
  const uint64_t at = table.pos();
  const auto name_len = table.read<uint16_t>("name length");
  XLOCO_FRAME_ENFORCE(name_len <= limits.max_name_bytes, kOverLimit,
                      "tensor #{} at offset {}: name of {} bytes, limit {}", index, at, name_len,
                      limits.max_name_bytes);
  e.name = table.read_string(name_len, "name");
  const auto rank = table.read<uint8_t>("rank");
  XLOCO_FRAME_ENFORCE(rank <= limits.max_rank, kOverLimit, "tensor '{}' (#{}): rank {}, limit {}",
                      quote(e.name), index, rank, limits.max_rank);
  e.numel = 1;
  e.shape.reserve(rank);
  for (uint8_t d = 0; d < rank; ++d) {
    const auto dim = table.read<uint64_t>("dimension");
    // A dimension of 0 makes any product legal, so each one is bounded on its own as well.
    XLOCO_FRAME_ENFORCE(dim <= limits.max_tensor_elements &&
                            (dim == 0 || e.numel <= limits.max_tensor_elements / dim),
                        kOverLimit,
                        "tensor '{}' (#{}): dimension {} = {} exceeds the limit of {} elements",
                        quote(e.name), index, d, dim, limits.max_tensor_elements);
    e.numel *= dim;
    e.shape.push_back(static_cast<int64_t>(dim));
  }
  e.offset = table.read<uint64_t>("payload offset");
  e.bytes = table.read<uint64_t>("payload bytes");
  const uint64_t expected_bytes =
      tensor_payload_bytes(info.codec, e.numel, info.block_size, info.topk, info.topk_bits);
  XLOCO_FRAME_ENFORCE(e.offset == expected_offset && e.bytes == expected_bytes, kCorrupt,
                      "tensor '{}' (#{}): payload range [{}, +{}) where {} {} elements need "
                      "[{}, +{})",
                      quote(e.name), index, e.offset, e.bytes, to_string(info.codec), e.numel,
                      expected_offset, expected_bytes);
  return e;
}

}  // namespace

FrameInfo parse_frame(const uint8_t* frame, size_t size, const Limits& limits) {
  XLOCO_FRAME_ENFORCE(size >= sizeof(kFrameMagic), kTruncated, "{} bytes, shorter than the magic",
                      size);
  XLOCO_FRAME_ENFORCE(std::memcmp(frame, kFrameMagic, sizeof(kFrameMagic)) == 0, kBadMagic,
                      "first bytes are {:02x} {:02x} {:02x} {:02x}, not \"XLCF\"", frame[0],
                      frame[1], frame[2], frame[3]);
  XLOCO_FRAME_ENFORCE(size >= 6, kTruncated, "{} bytes, shorter than the version", size);
  const auto version = load<uint16_t>(frame + 4);
  XLOCO_FRAME_ENFORCE(version == kFormatVersion, kBadVersion,
                      "format version {}, this build reads version {}", version, kFormatVersion);
  XLOCO_FRAME_ENFORCE(size >= 7, kTruncated, "{} bytes, shorter than the codec id", size);
  const uint8_t codec_id = frame[6];
  XLOCO_FRAME_ENFORCE(codec_id <= static_cast<uint8_t>(Codec::kTopk), kUnknownCodec,
                      "codec id {} at offset 6", codec_id);
  XLOCO_FRAME_ENFORCE(size >= kHeaderBytes, kTruncated, "{} bytes, shorter than the {}-byte header",
                      size, kHeaderBytes);

  FrameInfo info;
  info.codec = static_cast<Codec>(codec_id);
  const uint8_t flags = frame[7];
  XLOCO_FRAME_ENFORCE((flags & ~(kFlagZstd | kFlagTopk4)) == 0, kCorrupt,
                      "unknown flags {:#04x} at offset 7", flags);
  XLOCO_FRAME_ENFORCE((flags & kFlagTopk4) == 0 || info.codec == Codec::kTopk, kCorrupt,
                      "flags {:#04x} at offset 7: 4-bit values on a {} frame", flags,
                      to_string(info.codec));
  info.zstd = (flags & kFlagZstd) != 0;
  info.topk_bits = (flags & kFlagTopk4) != 0 ? 4 : 2;
  info.block_size = load<uint32_t>(frame + 8);
  const auto tensor_count = load<uint32_t>(frame + 12);
  const auto table_bytes = load<uint32_t>(frame + 16);
  info.payload_bytes = load<uint64_t>(frame + 20);
  info.stored_bytes = load<uint64_t>(frame + 28);
  info.topk = load<uint32_t>(frame + 36);

  const bool blockwise = info.codec == Codec::kInt8 || info.codec == Codec::kInt4;
  XLOCO_FRAME_ENFORCE(!blockwise || (info.block_size >= 1 && info.block_size <= kMaxBlockSize &&
                                     (info.codec != Codec::kInt4 || info.block_size % 2 == 0)),
                      kCorrupt, "block size {} at offset 8 is not valid for {}", info.block_size,
                      to_string(info.codec));
  if (info.codec == Codec::kTopk) {
    XLOCO_FRAME_ENFORCE(info.block_size >= 1 && info.block_size <= kMaxTopkBlock, kCorrupt,
                        "block size {} at offset 8 is not valid for topk (1..{})", info.block_size,
                        kMaxTopkBlock);
    XLOCO_FRAME_ENFORCE(info.topk >= 1 && info.topk <= info.block_size, kCorrupt,
                        "topk {} at offset 36 is not in 1..block size {}", info.topk,
                        info.block_size);
  } else {
    XLOCO_FRAME_ENFORCE(info.topk == 0, kCorrupt, "topk {} at offset 36 for codec {}", info.topk,
                        to_string(info.codec));
  }
  XLOCO_FRAME_ENFORCE(tensor_count <= limits.max_tensors, kOverLimit,
                      "{} tensors declared at offset 12, limit {}", tensor_count,
                      limits.max_tensors);
  XLOCO_FRAME_ENFORCE(info.payload_bytes <= limits.max_payload_bytes, kOverLimit,
                      "payload of {} bytes declared at offset 20, limit {}", info.payload_bytes,
                      limits.max_payload_bytes);
  // zstd never stores more than its bound (and the bound keeps the sums below from
  // overflowing); a raw payload stores exactly the payload.
  XLOCO_FRAME_ENFORCE(info.stored_bytes <= ZSTD_compressBound(info.payload_bytes), kCorrupt,
                      "stored payload of {} bytes declared at offset 28 for a payload of {}",
                      info.stored_bytes, info.payload_bytes);
  XLOCO_FRAME_ENFORCE(info.zstd || info.stored_bytes == info.payload_bytes, kCorrupt,
                      "raw payload stores {} bytes, header declares {}", info.stored_bytes,
                      info.payload_bytes);

  info.stored_offset = kHeaderBytes + uint64_t{table_bytes};
  const uint64_t total = info.stored_offset + info.stored_bytes;
  XLOCO_FRAME_ENFORCE(size >= total, kTruncated,
                      "{} bytes, the header declares {} (table {}, stored payload {})", size, total,
                      table_bytes, info.stored_bytes);
  XLOCO_FRAME_ENFORCE(size == total, kCorrupt, "{} trailing bytes after offset {}", size - total,
                      total);
  XLOCO_FRAME_ENFORCE(uint64_t{tensor_count} * kMinEntryBytes <= table_bytes, kCorrupt,
                      "{} tensors cannot fit a table of {} bytes", tensor_count, table_bytes);

  TableReader table(frame, kHeaderBytes, info.stored_offset);
  info.tensors.reserve(tensor_count);
  uint64_t offset = 0;
  for (uint32_t i = 0; i < tensor_count; ++i) {
    info.tensors.push_back(read_entry(table, i, offset, info, limits));
    offset += info.tensors.back().bytes;
    XLOCO_FRAME_ENFORCE(offset <= info.payload_bytes, kCorrupt,
                        "tensor '{}' (#{}) ends at payload byte {}, past the declared {}",
                        info.tensors.back().name, i, offset, info.payload_bytes);
  }
  XLOCO_FRAME_ENFORCE(table.pos() == table.end(), kCorrupt,
                      "tensor table ends at offset {}, header declares {}", table.pos(),
                      table.end());
  XLOCO_FRAME_ENFORCE(offset == info.payload_bytes, kCorrupt,
                      "tensors take {} payload bytes, header declares {}", offset,
                      info.payload_bytes);
  place_topk(info);
  return info;
}

void place_topk(FrameInfo& info) {
  if (info.codec != Codec::kTopk) return;
  std::vector<uint64_t> numels;
  numels.reserve(info.tensors.size());
  for (const TensorEntry& e : info.tensors) numels.push_back(e.numel);
  const auto at = topk_places(numels, info.block_size, info.topk, info.topk_bits);
  for (size_t i = 0; i < at.size(); ++i) info.tensors[i].topk_at = at[i];
}

size_t frame_prefix_bytes(const std::vector<TensorEntry>& tensors) {
  size_t n = kHeaderBytes;
  for (const TensorEntry& t : tensors) n += kMinEntryBytes + t.name.size() + 8 * t.shape.size();
  return n;
}

void write_frame_prefix(const FrameInfo& info, uint8_t* out) {
  const size_t table_bytes = frame_prefix_bytes(info.tensors) - kHeaderBytes;
  std::memcpy(out, kFrameMagic, sizeof(kFrameMagic));
  uint8_t* p = store<uint16_t>(out + 4, kFormatVersion);
  p = store<uint8_t>(p, static_cast<uint8_t>(info.codec));
  const bool topk4 = info.codec == Codec::kTopk && info.topk_bits == 4;
  p = store<uint8_t>(p, static_cast<uint8_t>((info.zstd ? kFlagZstd : 0) | (topk4 ? kFlagTopk4 : 0)));
  p = store<uint32_t>(p, info.block_size);
  p = store<uint32_t>(p, static_cast<uint32_t>(info.tensors.size()));
  p = store<uint32_t>(p, static_cast<uint32_t>(table_bytes));
  p = store<uint64_t>(p, info.payload_bytes);
  p = store<uint64_t>(p, info.stored_bytes);
  p = store<uint32_t>(p, info.codec == Codec::kTopk ? info.topk : 0);
  for (const TensorEntry& t : info.tensors) {
    p = store<uint16_t>(p, static_cast<uint16_t>(t.name.size()));
    std::memcpy(p, t.name.data(), t.name.size());
    p += t.name.size();
    p = store<uint8_t>(p, static_cast<uint8_t>(t.shape.size()));
    for (const int64_t d : t.shape) p = store<uint64_t>(p, static_cast<uint64_t>(d));
    p = store<uint64_t>(p, t.offset);
    p = store<uint64_t>(p, t.bytes);
  }
}

}  // namespace xloco::compress
