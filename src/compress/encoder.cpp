#include "compress/encoder.h"

#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <unordered_set>

#include "compress/error.h"
#include "compress/frame.h"
#include "compress/kernels.h"

namespace xloco::compress {
namespace {

// zstd is kept only if it saves at least 1/64 of the payload: on a 100 Mbit/s link that is
// about where the saved transfer time still beats decompressing it, and a raw payload is read
// in place by the decoder.
constexpr uint64_t kMinZstdSaving = 64;

void check_zstd(size_t rc, const char* what) {
  XLOCO_ENFORCE(!ZSTD_isError(rc), common::ConfigError, "zstd {}: {}", what, ZSTD_getErrorName(rc));
}

}  // namespace

struct Encoder::Zstd {
  ZSTD_CCtx* cctx = nullptr;
  ~Zstd() { ZSTD_freeCCtx(cctx); }
};

Encoder::Encoder(CodecConfig config) : config_(std::move(config)) {
  validate(config_);
  if (config_.zstd_level == 0) return;
  zstd_ = std::make_unique<Zstd>();
  zstd_->cctx = ZSTD_createCCtx();
  if (zstd_->cctx == nullptr) throw std::bad_alloc();
  check_zstd(ZSTD_CCtx_setParameter(zstd_->cctx, ZSTD_c_compressionLevel, config_.zstd_level),
             "compression level");
  check_zstd(ZSTD_CCtx_setParameter(zstd_->cctx, ZSTD_c_checksumFlag, 1), "content checksum");
  if (config_.zstd_threads > 0) {
    check_zstd(ZSTD_CCtx_setParameter(zstd_->cctx, ZSTD_c_nbWorkers, config_.zstd_threads),
               "worker threads (is libzstd built with multithreading?)");
  }
}

Encoder::~Encoder() = default;
Encoder::Encoder(Encoder&&) noexcept = default;
Encoder& Encoder::operator=(Encoder&&) noexcept = default;

std::vector<uint8_t> Encoder::encode(const std::vector<ConstTensorRef>& inputs) {
  std::vector<uint8_t> frame;
  encode(inputs, frame);
  return frame;
}

void Encoder::encode(const std::vector<ConstTensorRef>& inputs, std::vector<uint8_t>& frame) {
  const Limits& limits = config_.limits;
  XLOCO_FRAME_ENFORCE(inputs.size() <= limits.max_tensors, kOverLimit, "{} tensors, limit {}",
                      inputs.size(), limits.max_tensors);
  FrameInfo info;
  info.codec = config_.codec;
  info.block_size = config_.block_size;
  info.topk = config_.codec == Codec::kTopk ? config_.topk : 0;
  info.topk_bits = config_.codec == Codec::kTopk ? config_.topk_bits : 2;
  info.tensors.reserve(inputs.size());
  std::unordered_set<std::string_view> names;
  uint64_t offset = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ConstTensorRef& in = inputs[i];
    XLOCO_FRAME_ENFORCE(names.insert(in.name).second, kMismatch, "tensor '{}' (#{}) appears twice",
                        in.name, i);
    XLOCO_FRAME_ENFORCE(in.name.size() <= limits.max_name_bytes, kOverLimit,
                        "tensor #{}: name of {} bytes, limit {}", i, in.name.size(),
                        limits.max_name_bytes);
    XLOCO_FRAME_ENFORCE(in.shape.size() <= limits.max_rank, kOverLimit,
                        "tensor '{}': rank {}, limit {}", in.name, in.shape.size(),
                        limits.max_rank);
    TensorEntry e{in.name, in.shape, in.numel(), offset, 0, {}};
    for (const int64_t d : in.shape) {
      XLOCO_FRAME_ENFORCE(static_cast<uint64_t>(d) <= limits.max_tensor_elements, kOverLimit,
                          "tensor '{}': dimension {}, limit {} elements", in.name, d,
                          limits.max_tensor_elements);
    }
    XLOCO_FRAME_ENFORCE(e.numel <= limits.max_tensor_elements, kOverLimit,
                        "tensor '{}': {} elements, limit {}", in.name, e.numel,
                        limits.max_tensor_elements);
    XLOCO_FRAME_ENFORCE(in.data != nullptr || e.numel == 0, kMismatch,
                        "tensor '{}': no data for {} elements", in.name, e.numel);
    e.bytes = tensor_payload_bytes(info.codec, e.numel, info.block_size, info.topk, info.topk_bits);
    offset += e.bytes;
    XLOCO_FRAME_ENFORCE(offset <= limits.max_payload_bytes, kOverLimit,
                        "payload reaches {} bytes at tensor '{}', limit {}", offset, in.name,
                        limits.max_payload_bytes);
    info.tensors.push_back(std::move(e));
  }
  info.payload_bytes = offset;
  place_topk(info);
  // topk's tensors each write into all four sections (frame.h): its payload is put together
  // whole (under 1/8 of the fp32 tensors), then compressed section by section.
  const bool whole = info.codec == Codec::kTopk;

  // Sizes are checked against all residuals before any of them is created or touched.
  const bool feedback = config_.error_feedback && config_.codec != Codec::kFp32;
  if (feedback) {
    for (const TensorEntry& e : info.tensors) {
      const auto it = residuals_.find(e.name);
      XLOCO_FRAME_ENFORCE(it == residuals_.end() || it->second.size() == e.numel, kMismatch,
                          "tensor '{}' has {} elements, its residual from earlier encodes {}",
                          e.name, e.numel, it == residuals_.end() ? 0 : it->second.size());
    }
  }

  const size_t prefix = frame_prefix_bytes(info.tensors);
  XLOCO_FRAME_ENFORCE(prefix - kHeaderBytes <= std::numeric_limits<uint32_t>::max(), kOverLimit,
                      "tensor table of {} bytes, the format carries up to 4 GiB",
                      prefix - kHeaderBytes);
  // With zstd, each tensor is quantized into a scratch buffer the size of the largest tensor
  // and streamed into the compressor: the uncompressed payload never exists in full (topk:
  // the scratch holds the whole payload).
  uint8_t* payload = nullptr;
  ZSTD_outBuffer out{nullptr, 0, 0};
  if (zstd_) {
    uint64_t largest = 1;
    for (const TensorEntry& e : info.tensors) largest = std::max(largest, e.bytes);
    if (whole) largest = std::max<uint64_t>(1, info.payload_bytes);
    if (scratch_bytes_ < largest) {
      scratch_.reset();
      scratch_.reset(new uint8_t[largest]);
      scratch_bytes_ = largest;
    }
    // (+ 64: the few block headers that topk's section ends add)
    const size_t bound = ZSTD_compressBound(info.payload_bytes) + 64;
    frame.resize(prefix + bound);
    out = ZSTD_outBuffer{frame.data() + prefix, bound, 0};
    check_zstd(ZSTD_CCtx_reset(zstd_->cctx, ZSTD_reset_session_only), "reset");
    check_zstd(ZSTD_CCtx_setPledgedSrcSize(zstd_->cctx, info.payload_bytes), "pledged size");
  } else {
    frame.resize(prefix + info.payload_bytes);
    payload = frame.data() + prefix;
  }

  for (size_t i = 0; i < inputs.size(); ++i) {
    const ConstTensorRef& in = inputs[i];
    const TensorEntry& e = info.tensors[i];
    float* residual = feedback ? residual_for(e.name, e.numel) : nullptr;
    if (residual != nullptr && config_.residual_decay != 1.0f) {
      const float decay = config_.residual_decay;
      for (uint64_t j = 0; j < e.numel; ++j) residual[j] = decay * residual[j];
    }
    // topk's kernel takes the payload's start and writes where e.topk_at says.
    uint8_t* dst = zstd_ ? scratch_.get() : payload + (whole ? 0 : e.offset);
    const auto defect = kernels::encode(info.codec, in.data, residual, e.numel, info.block_size, dst,
                                        info.topk, info.topk_bits, e.topk_at);
    if (defect) {
      // With feedback, the residual holds x + e for the defective block.
      const float x = in.data[defect->index];
      const float w = residual != nullptr ? residual[defect->index] : x;
      reset_residuals();
      const std::string value = residual == nullptr || !std::isfinite(x)
                                    ? fmt::format("{}", x)
                                    : fmt::format("{} + residual = {}", x, w);
      XLOCO_FRAME_ENFORCE(defect->defect != kernels::Defect::kNonFinite, kNonFinite,
                          "tensor '{}' (#{}): element {} is {}", e.name, i, defect->index, value);
      XLOCO_FRAME_ENFORCE(
          false, kOverLimit, "tensor '{}' (#{}): element {} is {}, beyond the {} range ±{}", e.name,
          i, defect->index, value, to_string(info.codec), kernels::max_encodable(info.codec));
    }
    if (zstd_ && !whole) compress_part(out, dst, e.bytes, false);
  }
  if (zstd_ && whole && !info.tensors.empty()) {
    // One zstd block (at least) per section: each gets its own entropy tables.
    const TopkAt& first = info.tensors.front().topk_at;
    const uint64_t ends[4] = {first.lo, first.hi, first.codes, info.payload_bytes};
    uint64_t from = 0;
    for (const uint64_t end : ends) {
      compress_part(out, scratch_.get() + from, end - from, true);
      from = end;
    }
  }

  info.stored_bytes = info.payload_bytes;
  if (zstd_) {
    ZSTD_inBuffer none{nullptr, 0, 0};
    for (size_t left = 1; left != 0;) {
      left = ZSTD_compressStream2(zstd_->cctx, &out, &none, ZSTD_e_end);
      XLOCO_ENFORCE(!ZSTD_isError(left), common::Error, "zstd compression failed: {}",
                    ZSTD_getErrorName(left));
    }
    const size_t c = out.pos;
    info.zstd = c + info.payload_bytes / kMinZstdSaving < info.payload_bytes;
    if (info.zstd) {
      info.stored_bytes = c;
    } else if (info.payload_bytes != 0) {
      // zstd did not pay: store the payload raw, recovered from what was just compressed (the
      // residuals have moved on, so it cannot be quantized again).
      const std::vector<uint8_t> packed(frame.begin() + static_cast<std::ptrdiff_t>(prefix),
                                        frame.begin() + static_cast<std::ptrdiff_t>(prefix + c));
      frame.resize(prefix + info.payload_bytes);
      const size_t n =
          ZSTD_decompress(frame.data() + prefix, info.payload_bytes, packed.data(), packed.size());
      XLOCO_ENFORCE(!ZSTD_isError(n) && n == info.payload_bytes, common::Error,
                    "zstd round trip of an incompressible payload failed");
    }
    frame.resize(prefix + info.stored_bytes);
  }
  write_frame_prefix(info, frame.data());
  stats_ = EncodeStats{info.payload_bytes, frame.size(), info.zstd};
}

void Encoder::compress_part(ZSTD_outBuffer_s& out, const uint8_t* data, uint64_t size, bool flush) {
  ZSTD_inBuffer src{data, size, 0};
  const ZSTD_EndDirective how = flush ? ZSTD_e_flush : ZSTD_e_continue;
  for (size_t left = 1; src.pos < src.size || (flush && left != 0);) {
    left = ZSTD_compressStream2(zstd_->cctx, &out, &src, how);
    XLOCO_ENFORCE(!ZSTD_isError(left), common::Error, "zstd compression failed: {}",
                  ZSTD_getErrorName(left));
  }
}

float* Encoder::residual_for(const std::string& name, uint64_t numel) {
  auto it = residuals_.find(name);
  if (it == residuals_.end()) it = residuals_.emplace(name, std::vector<float>(numel)).first;
  return it->second.data();
}

const std::vector<float>* Encoder::residual(std::string_view name) const {
  const auto it = residuals_.find(std::string(name));
  return it == residuals_.end() ? nullptr : &it->second;
}

void Encoder::set_residual(std::string_view name, std::vector<float> values) {
  XLOCO_FRAME_ENFORCE(config_.error_feedback && config_.codec != Codec::kFp32, kMismatch,
                      "residual '{}' given to a {} encoder{}, which keeps none", name,
                      to_string(config_.codec), config_.error_feedback ? "" : " without feedback");
  for (size_t i = 0; i < values.size(); ++i) {
    XLOCO_FRAME_ENFORCE(std::isfinite(values[i]), kNonFinite, "residual '{}' element {} is {}",
                        name, i, values[i]);
  }
  residuals_[std::string(name)] = std::move(values);
}

void Encoder::reset_residuals() {
  for (auto& [name, r] : residuals_) std::fill(r.begin(), r.end(), 0.0f);
}

}  // namespace xloco::compress
