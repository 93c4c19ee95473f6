// Codec settings shared by the encoder and the decoder: which quantizer, how blocks are cut,
// how the payload is compressed, and the limits that bound what a frame from another machine
// may make us allocate. Parsing these from JSON belongs to common/config, not here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace xloco::compress {

// Wire ids: never renumber, only append (the id is stored in every frame).
enum class Codec : uint8_t {
  kFp32 = 0,  // exact
  kBf16 = 1,  // round to nearest even, 2 bytes per value
  kInt8 = 2,  // blockwise absmax, fp32 scale per block
  kInt4 = 3,  // blockwise absmax, two values per byte, fp32 scale per block
  kTopk = 4,  // per block: the topk largest |values| at 2 bits (±scale, ±2·scale) or 4 bits
              // (±m·scale, m = 1..8; frame flag kFlagTopk4), u16 position gaps; the payload in
              // four sections (format version 4, frame.h)
};

// Bounds a decoder enforces before it allocates anything a frame declares. The encoder checks
// them too, so that it never emits a frame its peers would refuse.
struct Limits {
  uint64_t max_tensors = 1 << 16;             // entries in the tensor table
  uint64_t max_tensor_elements = 1ull << 32;  // elements in one tensor
  uint64_t max_payload_bytes = 1ull << 34;    // uncompressed payload of one frame (16 GiB)
  uint32_t max_name_bytes = 1024;             // bytes of one tensor name
  uint32_t max_rank = 8;                      // dimensions of one tensor
};

struct CodecConfig {
  Codec codec = Codec::kInt8;  // quantizer applied to every tensor of a frame
  uint32_t block_size = 256;   // elements per absmax block (int8, int4; even for int4), or per
                               // top-k chunk (topk; at most kMaxTopkBlock)
  uint32_t topk = 0;           // topk: values sent per block (1..block_size); else unused (0)
  uint32_t topk_bits = 2;      // topk: bits per value sent, 2 or 4 (else unused)
  int zstd_level = 1;          // 0 stores the payload raw; < 0 are zstd's fast levels (*)
  int zstd_threads = 0;        // zstd worker threads for compression; 0 compresses inline
  bool error_feedback = true;  // keep e ← (x + e) − deq(Q(x + e)) per tensor (design §2)
  float residual_decay = 1.0f; // with feedback, e ← residual_decay · e before each encode
                               // (SparseLoCo's β); 1 keeps every unsent value exactly
  Limits limits;               // also bounds what this side emits
};

// (*) Level 1 by measurement (experiments/RESULTS.md, issue 3): on pseudo-gradient-like data
// it cuts int8 frames by 20 % and int4 frames by 40 % at about 1.5 GB/s of fp32 input per
// core, which pays on links below roughly 0.75 Gbit/s; level 3 compresses no better and is
// slower, and negative levels skip the entropy coding that is the whole gain on quantized
// codes. Level 0 runs near memory speed, for fast links. Either way a frame falls back to a
// raw payload when zstd saves under 1/64 of it; raw payloads carry no checksum of their own
// (the transport authenticates every byte).

inline constexpr uint32_t kMaxBlockSize = 1 << 20;
inline constexpr uint32_t kMaxTopkBlock = 1 << 16;  // positions are u16

// "fp32", "bf16", "int8", "int4", "topk"; parse_codec throws common::ConfigError on anything else.
std::string_view to_string(Codec codec);
Codec parse_codec(std::string_view name);

// Throw common::ConfigError naming the first bad field.
void validate(const CodecConfig& config);
void validate(const Limits& limits);

// Payload bytes of one tensor of n elements; n ≤ 2^62 keeps this overflow-free. Fixed for every
// codec (topk sends exactly min(topk, block length) values per block), so a frame's size is known
// from its table before any payload byte is read.
uint64_t tensor_payload_bytes(Codec codec, uint64_t n, uint32_t block_size, uint32_t topk = 0,
                              uint32_t topk_bits = 2);

// topk: bytes of one block of `len` elements: fp32 scale, u16 position gaps, then the codes,
// `topk_bits` (2 or 4) each.
uint64_t topk_block_bytes(uint32_t len, uint32_t topk, uint32_t topk_bits = 2);

// topk: a frame's payload is four sections, each running over every block of every tensor in
// table order (frame.h): block scales, position gaps' low bytes, their high bytes, value codes.
// TopkAt is where one tensor's first block lies in each, as byte offsets in the payload.
struct TopkAt {
  uint64_t scales = 0, lo = 0, hi = 0, codes = 0;
};
// The TopkAt of each tensor of these element counts; the sections add up to the sum of
// tensor_payload_bytes, so a tensor's table range [offset, offset + bytes) keeps its size.
std::vector<TopkAt> topk_places(const std::vector<uint64_t>& numels, uint32_t block_size,
                                uint32_t topk, uint32_t topk_bits);

}  // namespace xloco::compress
