// The receiving side of the codec: checks a frame from another machine and writes (or adds)
// its dequantized values into preallocated fp32 buffers of known names and shapes. Frames are
// untrusted input: every error is a FrameError, nothing is allocated beyond what the targets
// themselves need, and on any error the targets are left untouched. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "compress/codec.h"
#include "compress/frame.h"
#include "compress/tensor_ref.h"

namespace xloco::compress {

// One block of a tensor as a frame carries it (Decoder::for_each_block): a topk block's sent
// values only, at their positions (strictly increasing, inside the block; a value sent as 0
// included); every element of a dense codec's block. The values are the floats decode() writes
// there (deq, one rounding).
struct BlockValues {
  uint64_t start = 0;             // the block's first element, in its tensor
  uint32_t len = 0;               // its elements
  uint32_t n = 0;                 // values given
  const uint32_t* pos = nullptr;  // within the block; nullptr: value j is element j (n = len)
  const float* value = nullptr;
};
using BlockVisitor = std::function<void(size_t tensor, const BlockValues& block)>;

// Tensors first..last − 1 of a frame's table: what a call that takes one checks and writes or
// visits (the others' targets need a name and shape only, no buffer). The whole table by
// default. A caller that works through a frame span by span (relay.cpp, to keep its scratch at
// one span) checks the whole frame once first: norm() with targets.
struct TensorSpan {
  size_t first = 0;
  size_t last = SIZE_MAX;
  // The caller has checked this very frame whole (norm() with targets) and it has not changed
  // since: its values are not checked again (the structure and the targets still are).
  bool checked = false;
  bool has(size_t i) const { return i >= first && i < last; }
  bool check(size_t i) const { return has(i) && !checked; }
};

class Decoder {
 public:
  // Throws common::ConfigError on limits the frame format cannot carry.
  explicit Decoder(Limits limits = {});
  ~Decoder();
  Decoder(Decoder&&) noexcept;
  Decoder& operator=(Decoder&&) noexcept;

  // Header and table only (names, shapes, codec), with every structural check.
  FrameInfo inspect(const uint8_t* frame, size_t size) const;

  // targets[i] must have the name and shape of the frame's tensor i. Then the payload is
  // decompressed (zstd checksum verified) and every value checked finite before the first
  // target is written. Dequantization is elementwise fp32 (q · scale, one rounding; add mode:
  // one more), so the same frame gives the same bits on every machine.
  void decode(const uint8_t* frame, size_t size, const std::vector<TensorRef>& targets);
  void decode(const std::vector<uint8_t>& frame, const std::vector<TensorRef>& targets) {
    decode(frame.data(), frame.size(), targets);
  }

  // targets[i] += deq(tensor i). The frame's values are checked finite first, but a sum can
  // still overflow to ±Inf when a target already holds values near FLT_MAX.
  void decode_add(const uint8_t* frame, size_t size, const std::vector<TensorRef>& targets,
                  TensorSpan span = {});
  void decode_add(const std::vector<uint8_t>& frame, const std::vector<TensorRef>& targets) {
    decode_add(frame.data(), frame.size(), targets);
  }

  // The L2 norm of the frame's values, after the same checks as decode() (structure, zstd
  // checksum, every value finite), without writing them anywhere: the head judges a
  // contribution by it before adding it into Δ. Memory: as decode().
  double norm(const uint8_t* frame, size_t size);
  // The same after the checks decode() and for_each_block() make against `targets` (names and
  // shapes; their data is neither read nor written): the whole frame checked as they would.
  double norm(const uint8_t* frame, size_t size, const std::vector<TensorRef>& targets);

  // visit(i, block) for each block of each of the frame's tensors, in table order and within a
  // tensor in order: blocks of the frame's block size (a codec without blocks: the tensor as
  // one), with the values the frame carries there. After the checks decode() makes against
  // `targets` (names and shapes; their data is neither read nor written), so `visit` sees only
  // a frame decode() would accept. Memory: as decode(), plus one block's values (topk: a topk
  // frame is never written out densely) or one tensor's (a dense codec).
  // With a span, only its tensors are checked and visited.
  void for_each_block(const uint8_t* frame, size_t size, const std::vector<TensorRef>& targets,
                      const BlockVisitor& visit, TensorSpan span = {});

  const Limits& limits() const { return limits_; }

 private:
  void check_targets(const FrameInfo& info, const std::vector<TensorRef>& targets,
                     TensorSpan span = {}) const;
  double norm_of(const uint8_t* frame, size_t size, const std::vector<TensorRef>* targets);
  // Tensor i's block size for a visit; throws kOverLimit where one visit cannot carry a block.
  static uint64_t check_visitable(const FrameInfo& info, size_t i);
  void visit_tensor(const FrameInfo& info, size_t i, const uint8_t* bytes, const BlockVisitor& visit);
  void run(const uint8_t* frame, size_t size, const std::vector<TensorRef>& targets, bool add,
           TensorSpan span = {});
  const uint8_t* payload(const uint8_t* frame, const FrameInfo& info);
  void run_streamed(const uint8_t* frame, const FrameInfo& info,
                    const std::vector<TensorRef>& targets, bool add, TensorSpan span);
  // One pass over a large zstd payload, a tensor at a time: `each(i, bytes)` sees tensor i's
  // payload; the zstd frame's end and checksum are verified after the last tensor.
  // Checks the zstd frame's sizes and sizes the scratch buffer for its largest tensor; returns
  // the stored payload for stream_pass.
  const uint8_t* prepare_stream(const uint8_t* frame, const FrameInfo& info);
  template <class Each>
  void stream_pass(const uint8_t* stored, const FrameInfo& info, bool verify_end, Each&& each);
  void check_tensor(const FrameInfo& info, size_t i, const uint8_t* bytes) const;
  // Whether this frame is decoded a tensor at a time (large zstd payloads, not topk).
  static bool streamed(const FrameInfo& info);
  // Where the kernels' bytes for tensor i start in the payload: its range, or for topk the
  // payload's start (its parts lie in four sections, frame.h); and that pointer.
  static uint64_t tensor_offset(const FrameInfo& info, size_t i);
  static const uint8_t* tensor_bytes(const FrameInfo& info, size_t i, const uint8_t* payload);
  const uint8_t* check_zstd_frame(const uint8_t* frame, const FrameInfo& info) const;
  void reserve_scratch(uint64_t bytes);

  Limits limits_;
  // Compressed payloads up to this size are decompressed whole in one pass; larger ones are
  // streamed one tensor at a time (two passes), so memory stays at the largest tensor; topk
  // payloads (each tensor in four sections, under 1/8 of the fp32 model) are always whole.
  static constexpr uint64_t kWholePayloadBytes = 8ull << 20;
  std::unique_ptr<uint8_t[]> scratch_;  // decompressed payload or tensor; sized by validated targets
  uint64_t scratch_bytes_ = 0;
  struct Zstd;
  std::unique_ptr<Zstd> zstd_;
  std::vector<float> block_values_;     // for_each_block: one block's values
  std::vector<uint32_t> block_pos_;     // and their positions (topk)
};

}  // namespace xloco::compress
