#include "compress/decoder.h"

#include <fmt/ranges.h>
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <new>
#include <string>

#include "common/text.h"
#include "compress/error.h"
#include "compress/kernels.h"

namespace xloco::compress {
namespace {

// A tensor name from a frame is a peer's bytes: quoted escaped and bounded (design §10).
std::string quote(const std::string& name) { return common::printable(name, 96); }

std::string describe_content_size(unsigned long long declared) {
  if (declared == ZSTD_CONTENTSIZE_ERROR) return "is not a zstd frame";
  if (declared == ZSTD_CONTENTSIZE_UNKNOWN) return "does not declare its content size";
  return fmt::format("declares {} content bytes", declared);
}

}  // namespace

struct Decoder::Zstd {
  ZSTD_DCtx* dctx = nullptr;
  ~Zstd() { ZSTD_freeDCtx(dctx); }
};

Decoder::Decoder(Limits limits) : limits_(limits), zstd_(std::make_unique<Zstd>()) {
  validate(limits_);
  zstd_->dctx = ZSTD_createDCtx();
  if (zstd_->dctx == nullptr) throw std::bad_alloc();
}

Decoder::~Decoder() = default;
Decoder::Decoder(Decoder&&) noexcept = default;
Decoder& Decoder::operator=(Decoder&&) noexcept = default;

FrameInfo Decoder::inspect(const uint8_t* frame, size_t size) const {
  return parse_frame(frame, size, limits_);
}

void Decoder::decode(const uint8_t* frame, size_t size, const std::vector<TensorRef>& targets) {
  run(frame, size, targets, false);
}

void Decoder::decode_add(const uint8_t* frame, size_t size, const std::vector<TensorRef>& targets,
                         TensorSpan span) {
  run(frame, size, targets, true, span);
}

void Decoder::check_targets(const FrameInfo& info, const std::vector<TensorRef>& targets,
                            TensorSpan span) const {
  XLOCO_FRAME_ENFORCE(targets.size() == info.tensors.size(), kMismatch,
                      "frame holds {} tensors, {} targets given", info.tensors.size(),
                      targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    const TensorEntry& e = info.tensors[i];
    const TensorRef& t = targets[i];
    XLOCO_FRAME_ENFORCE(t.name == e.name, kMismatch, "tensor #{}: frame has '{}', target is '{}'",
                        i, quote(e.name), t.name);
    XLOCO_FRAME_ENFORCE(t.shape == e.shape, kMismatch,
                        "tensor '{}': frame shape [{}], target shape [{}]", quote(e.name),
                        fmt::join(e.shape, ", "), fmt::join(t.shape, ", "));
    XLOCO_FRAME_ENFORCE(t.data != nullptr || e.numel == 0 || !span.has(i), kMismatch,
                        "tensor '{}': target has no buffer for {} elements", quote(e.name), e.numel);
  }
}

void Decoder::run(const uint8_t* frame, size_t size, const std::vector<TensorRef>& targets,
                  bool add, TensorSpan span) {
  const FrameInfo info = parse_frame(frame, size, limits_);
  check_targets(info, targets, span);

  // From here the payload size equals what the targets need, so allocating it is bounded.
  if (streamed(info)) {
    run_streamed(frame, info, targets, add, span);
    return;
  }
  const uint8_t* p = payload(frame, info);
  for (size_t i = 0; i < targets.size(); ++i) {
    if (span.check(i)) check_tensor(info, i, tensor_bytes(info, i, p));
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    if (!span.has(i)) continue;
    const TensorEntry& e = info.tensors[i];
    kernels::decode(info.codec, tensor_bytes(info, i, p), e.numel, info.block_size,
                    targets[i].data, add, info.topk, info.topk_bits, e.topk_at);
  }
}

void Decoder::check_tensor(const FrameInfo& info, size_t i, const uint8_t* bytes) const {
  const TensorEntry& e = info.tensors[i];
  const auto defect = kernels::check(info.codec, bytes, e.numel, info.block_size, info.topk,
                                     info.topk_bits, e.topk_at);
  if (!defect) return;
  const uint64_t at = tensor_offset(info, i) + defect->byte_offset;
  const std::string where = info.zstd ? fmt::format("uncompressed payload byte {}", at)
                                      : fmt::format("frame offset {}", info.stored_offset + at);
  XLOCO_FRAME_ENFORCE(
      defect->defect != kernels::Defect::kNonFinite, kNonFinite,
      "tensor '{}' (#{}): NaN or Inf {} at {}", quote(e.name), i,
      info.codec == Codec::kFp32 || info.codec == Codec::kBf16 ? "value" : "scale", where);
  XLOCO_FRAME_ENFORCE(defect->defect != kernels::Defect::kBadIndex, kCorrupt,
                      "tensor '{}' (#{}): topk position gap at {} puts a position outside its "
                      "block of {} or repeats one (a zero gap after the first)",
                      quote(e.name), i, where, info.block_size);
  XLOCO_FRAME_ENFORCE(false, kCorrupt,
                      "tensor '{}' (#{}): block scale at {} is negative or above 2^120", quote(e.name), i,
                      where);
}

template <class Each>
void Decoder::stream_pass(const uint8_t* stored, const FrameInfo& info, bool verify_end,
                          Each&& each) {
  ZSTD_DCtx* dctx = zstd_->dctx;
  XLOCO_ENFORCE(!ZSTD_isError(ZSTD_DCtx_reset(dctx, ZSTD_reset_session_only)), common::Error,
                "zstd decoder reset failed");
  ZSTD_inBuffer in{stored, info.stored_bytes, 0};
  const auto fail = [&](const std::string& why) {
    XLOCO_FRAME_ENFORCE(false, kCorrupt, "zstd payload at frame offset {}: {}",
                        info.stored_offset, why);
  };
  int stalled = 0;  // zstd may return without progress between stages; it gives up at 16
  const auto step = [&](ZSTD_outBuffer& out) {
    const size_t in_before = in.pos, out_before = out.pos;
    const size_t rc = ZSTD_decompressStream(dctx, &out, &in);
    if (ZSTD_isError(rc)) fail(ZSTD_getErrorName(rc));
    stalled = in.pos == in_before && out.pos == out_before ? stalled + 1 : 0;
    if (stalled > 32) fail("truncated");
    return rc;
  };
  size_t left = 1;  // 0 once zstd has seen the frame end and verified its checksum
  for (size_t i = 0; i < info.tensors.size(); ++i) {
    const TensorEntry& e = info.tensors[i];
    ZSTD_outBuffer out{scratch_.get(), e.bytes, 0};
    while (out.pos < out.size) {
      left = step(out);
      if (left == 0 && out.pos < out.size) fail("ends before the payload does");
    }
    each(i, static_cast<const uint8_t*>(scratch_.get()));
  }
  if (!verify_end) return;
  uint8_t extra = 0;  // the epilogue: frame end and content checksum
  ZSTD_outBuffer more{&extra, 1, 0};
  while (left != 0) {
    left = step(more);
    if (more.pos != 0) fail("longer than the header declares");
  }
  if (in.pos != in.size) fail("bytes after the zstd frame");
}

// A large compressed payload is decompressed twice, one tensor at a time into a buffer the size
// of the largest tensor: the first pass checks every value and the zstd checksum, the second
// writes the targets. Nothing is written unless the whole frame is sound, and no buffer the
// size of the payload is ever held.
const uint8_t* Decoder::prepare_stream(const uint8_t* frame, const FrameInfo& info) {
  const uint8_t* stored = check_zstd_frame(frame, info);
  uint64_t largest = 1;
  for (const TensorEntry& e : info.tensors) largest = std::max(largest, e.bytes);
  reserve_scratch(largest);
  return stored;
}

void Decoder::run_streamed(const uint8_t* frame, const FrameInfo& info,
                           const std::vector<TensorRef>& targets, bool add, TensorSpan span) {
  const uint8_t* stored = prepare_stream(frame, info);
  stream_pass(stored, info, true, [&](size_t i, const uint8_t* bytes) {
    if (span.check(i)) check_tensor(info, i, bytes);
  });
  stream_pass(stored, info, false, [&](size_t i, const uint8_t* bytes) {
    if (!span.has(i)) return;
    const TensorEntry& e = info.tensors[i];
    kernels::decode(info.codec, bytes, e.numel, info.block_size, targets[i].data, add, info.topk,
                    info.topk_bits);
  });
}

void Decoder::for_each_block(const uint8_t* frame, size_t size,
                             const std::vector<TensorRef>& targets, const BlockVisitor& visit,
                             TensorSpan span) {
  const FrameInfo info = parse_frame(frame, size, limits_);
  check_targets(info, targets, span);
  const auto check = [&](size_t i, const uint8_t* bytes) {
    if (span.check(i)) check_tensor(info, i, bytes);
  };
  const auto each = [&](size_t i, const uint8_t* bytes) {
    if (span.has(i)) visit_tensor(info, i, bytes, visit);
  };
  if (streamed(info)) {  // as run_streamed: checked whole first, then visited
    const uint8_t* stored = prepare_stream(frame, info);
    stream_pass(stored, info, true, check);
    stream_pass(stored, info, false, each);
    return;
  }
  const uint8_t* p = payload(frame, info);
  for (size_t i = 0; i < info.tensors.size(); ++i) check(i, tensor_bytes(info, i, p));
  for (size_t i = 0; i < info.tensors.size(); ++i) each(i, tensor_bytes(info, i, p));
}

uint64_t Decoder::check_visitable(const FrameInfo& info, size_t i) {
  const TensorEntry& e = info.tensors[i];
  const uint64_t block = info.block_size > 0 ? info.block_size : std::max<uint64_t>(e.numel, 1);
  XLOCO_FRAME_ENFORCE(block <= UINT32_MAX, kOverLimit,
                      "tensor '{}': a block of {} elements is more than one visit can carry",
                      quote(e.name), block);
  return block;
}

void Decoder::visit_tensor(const FrameInfo& info, size_t i, const uint8_t* bytes,
                           const BlockVisitor& visit) {
  const TensorEntry& e = info.tensors[i];
  const uint64_t block = check_visitable(info, i);
  if (info.codec == Codec::kTopk) {
    block_values_.resize(std::min<uint64_t>(info.topk, block));
    block_pos_.resize(block_values_.size());
    kernels::for_each_topk_value_block(bytes, e.topk_at, e.numel, info.block_size, info.topk,
                                       info.topk_bits, block_pos_.data(), block_values_.data(),
                                       [&](uint64_t start, uint32_t len, uint32_t n) {
                                         visit(i, {start, len, n, block_pos_.data(),
                                                   block_values_.data()});
                                       });
    return;
  }
  // A dense codec: the tensor's values once (into a buffer of its size), then block by block.
  block_values_.resize(e.numel);
  kernels::decode(info.codec, bytes, e.numel, info.block_size, block_values_.data(), false,
                  info.topk, info.topk_bits, e.topk_at);
  for (uint64_t start = 0; start < e.numel; start += block) {
    const auto len = static_cast<uint32_t>(std::min<uint64_t>(block, e.numel - start));
    visit(i, {start, len, len, nullptr, block_values_.data() + start});
  }
}

double Decoder::norm(const uint8_t* frame, size_t size) { return norm_of(frame, size, nullptr); }

double Decoder::norm(const uint8_t* frame, size_t size, const std::vector<TensorRef>& targets) {
  return norm_of(frame, size, &targets);
}

double Decoder::norm_of(const uint8_t* frame, size_t size, const std::vector<TensorRef>* targets) {
  const FrameInfo info = parse_frame(frame, size, limits_);
  if (targets != nullptr) {
    check_targets(info, *targets);
    for (size_t i = 0; i < info.tensors.size(); ++i) check_visitable(info, i);  // as for_each_block
  }
  double sum = 0;
  const auto tensor = [&](size_t i, const uint8_t* bytes) {
    check_tensor(info, i, bytes);
    const TensorEntry& e = info.tensors[i];
    sum += kernels::sum_squares(info.codec, bytes, e.numel, info.block_size, info.topk,
                                info.topk_bits, e.topk_at);
  };
  if (streamed(info)) {
    stream_pass(prepare_stream(frame, info), info, true, tensor);
  } else {
    const uint8_t* p = payload(frame, info);
    for (size_t i = 0; i < info.tensors.size(); ++i) tensor(i, tensor_bytes(info, i, p));
  }
  return std::sqrt(sum);
}

bool Decoder::streamed(const FrameInfo& info) {
  // topk's tensors each lie in all four sections of the payload (frame.h): never streamed.
  return info.zstd && info.payload_bytes > kWholePayloadBytes && info.codec != Codec::kTopk;
}

uint64_t Decoder::tensor_offset(const FrameInfo& info, size_t i) {
  return info.codec == Codec::kTopk ? 0 : info.tensors[i].offset;
}

const uint8_t* Decoder::tensor_bytes(const FrameInfo& info, size_t i, const uint8_t* payload) {
  return payload + tensor_offset(info, i);
}

void Decoder::reserve_scratch(uint64_t bytes) {
  if (scratch_bytes_ >= bytes && scratch_) return;
  scratch_.reset();
  scratch_bytes_ = std::max<uint64_t>(bytes, 1);
  scratch_.reset(new uint8_t[scratch_bytes_]);
}

const uint8_t* Decoder::check_zstd_frame(const uint8_t* frame, const FrameInfo& info) const {
  const uint8_t* stored = frame + info.stored_offset;
  const unsigned long long declared = ZSTD_getFrameContentSize(stored, info.stored_bytes);
  XLOCO_FRAME_ENFORCE(declared == info.payload_bytes, kCorrupt,
                      "zstd payload at frame offset {} {}, the header declares {} bytes",
                      info.stored_offset, describe_content_size(declared), info.payload_bytes);
  const size_t frame_size = ZSTD_findFrameCompressedSize(stored, info.stored_bytes);
  XLOCO_FRAME_ENFORCE(!ZSTD_isError(frame_size) && frame_size == info.stored_bytes, kCorrupt,
                      "zstd payload at frame offset {}: {}, the header declares {} bytes",
                      info.stored_offset,
                      ZSTD_isError(frame_size) ? ZSTD_getErrorName(frame_size)
                                               : fmt::format("{} bytes", frame_size),
                      info.stored_bytes);
  return stored;
}

const uint8_t* Decoder::payload(const uint8_t* frame, const FrameInfo& info) {
  if (!info.zstd) return frame + info.stored_offset;
  const uint8_t* stored = check_zstd_frame(frame, info);
  reserve_scratch(info.payload_bytes);
  const size_t n = ZSTD_decompressDCtx(zstd_->dctx, scratch_.get(), info.payload_bytes, stored,
                                       info.stored_bytes);
  XLOCO_FRAME_ENFORCE(!ZSTD_isError(n) && n == info.payload_bytes, kCorrupt,
                      "zstd payload at frame offset {}: {}", info.stored_offset,
                      ZSTD_isError(n)
                          ? ZSTD_getErrorName(n)
                          : fmt::format("{} bytes, expected {}", n, info.payload_bytes));
  return scratch_.get();
}

}  // namespace xloco::compress
