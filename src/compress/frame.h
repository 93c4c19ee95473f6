// The codec frame on the wire (design §6): a fixed header, a tensor table, then the payload,
// stored as one zstd frame (content checksum on) or raw. This file owns the byte layout and
// every structural check; it neither quantizes nor decompresses.
//
// All integers little-endian. Header (40 bytes; version 2 added the topk codec and field,
// version 3 sends topk positions as gaps, version 4 puts a topk payload in sections):
//   0  "XLCF"   4  u16 version   6  u8 codec   7  u8 flags (bit 0: payload is zstd; bit 1,
//      topk only: values at 4 bits; a frame without it is byte for byte what it was before)
//   8  u32 block_size   12 u32 tensor_count   16 u32 table_bytes
//   20 u64 payload_bytes (uncompressed)   28 u64 stored_bytes (what follows the table)
//   36 u32 topk (values per block for the topk codec, 0 for the others)
// Table entry, tensor_count times:
//   u16 name_len, name bytes, u8 rank, u64 dims[rank], u64 offset, u64 bytes (in the payload)
// Per tensor payload: fp32 4n bytes; bf16 2n; int8 4·blocks scales then n bytes;
//   int4 4·blocks scales then ceil(n/2) bytes (element 2k in the low nibble, stored as q + 8).
// topk: the payload is four sections, each over every block of every tensor in table order
//   (block of len elements, k = min(topk, len)): (1) each block's f32 scale; (2) each block's
//   k positions as u16 gaps g_j = p_j − p_(j−1) (p_(−1) = 0; g_j ≥ 1 for j ≥ 1, so positions
//   strictly increase; p_(k−1) < len), low bytes; (3) the same gaps' high bytes; (4) each
//   block's ceil(k/4) bytes of 2-bit codes (value j in bits 2(j mod 4)..: bit 0 magnitude 1 or
//   2, bit 1 sign), value = ±magnitude·scale; with flag bit 1, ceil(k/2) bytes of 4-bit codes
//   (value j in bits 4(j mod 2)..: bits 0-2 magnitude − 1, so 1..8, bit 3 sign). A tensor's
//   table range [offset, offset + bytes) keeps the size of its parts, which lie where
//   codec.h topk_places says. The encoder ends a zstd block at each section's end, so that
//   each section gets an entropy table of its own: the gaps' low bytes then cost about their
//   entropy, where one table shared with codes and scales cost about 1 bit a value more.
//   A topk payload is decompressed whole (no streaming): it is under 1/8 of the fp32 model.
// Tensors are packed in table order without gaps; the frame ends exactly after stored_bytes.
// A raw payload (zstd did not pay) has no checksum of its own: the transport authenticates
// every byte (CURVE, design §7); the decoder still checks every value it writes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "compress/codec.h"
#include "compress/tensor_ref.h"

namespace xloco::compress {

inline constexpr char kFrameMagic[4] = {'X', 'L', 'C', 'F'};
inline constexpr uint16_t kFormatVersion = 4;
inline constexpr size_t kHeaderBytes = 40;
inline constexpr uint8_t kFlagZstd = 1;
inline constexpr uint8_t kFlagTopk4 = 2;  // topk values at 4 bits

struct TensorEntry {
  std::string name;
  Shape shape;
  uint64_t numel = 0;
  uint64_t offset = 0;  // in the uncompressed payload
  uint64_t bytes = 0;
  TopkAt topk_at;  // topk: where its parts lie in the four sections (not on the wire)
};

struct FrameInfo {
  Codec codec = Codec::kFp32;
  uint32_t block_size = 0;
  uint32_t topk = 0;           // topk codec: values per block
  uint32_t topk_bits = 2;      // topk codec: bits per value (2, or 4 with kFlagTopk4)
  bool zstd = false;           // payload stored as a zstd frame, else raw
  uint64_t payload_bytes = 0;  // uncompressed
  uint64_t stored_bytes = 0;   // as on the wire
  uint64_t stored_offset = 0;  // frame offset of the stored payload
  std::vector<TensorEntry> tensors;
};

// Reads and checks header and table against `limits`: magic, version, codec, flags, every
// declared count and size (before anything is allocated for it), that offsets tile the
// payload and that the frame ends exactly after it. Throws FrameError; never reads the payload.
FrameInfo parse_frame(const uint8_t* frame, size_t size, const Limits& limits);

// topk: sets each entry's topk_at from the table (codec.h topk_places); nothing otherwise.
void place_topk(FrameInfo& info);

// Bytes that header plus table take for these entries.
size_t frame_prefix_bytes(const std::vector<TensorEntry>& tensors);

// Writes header and table (frame_prefix_bytes(info.tensors) bytes) to `out`.
void write_frame_prefix(const FrameInfo& info, uint8_t* out);

}  // namespace xloco::compress
