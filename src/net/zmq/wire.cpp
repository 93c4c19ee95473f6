#include "net/zmq/wire.h"

#include "net/protocol.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "net/errors.h"
#include "net/zmq/options.h"

namespace xloco::net::zeromq {
namespace {

constexpr std::uint8_t kWireVersion = 2;
enum Kind : std::uint8_t { kWhole = 0, kStart = 1, kChunk = 2 };
// Below this a part is copied: one small memcpy is cheaper than a shared_ptr hand-off.
constexpr std::size_t kZeroCopyMinBytes = 4096;
constexpr std::size_t kHugePage = std::size_t{2} << 20;
// A message is a header frame and its binary ones: at most an UPDATE's payload and its
// relayed frames (protocol.h).
constexpr std::size_t kMaxStreamFrames = 2 + kMaxUpdateParts;

void put_u64(std::uint8_t* out, std::uint64_t v) {
  for (int b = 0; b < 8; ++b) out[b] = static_cast<std::uint8_t>(v >> (8 * b));
}
std::uint64_t get_u64(const std::uint8_t* in) {
  std::uint64_t v = 0;
  for (int b = 0; b < 8; ++b) v |= std::uint64_t{in[b]} << (8 * b);
  return v;
}

void release_owner(void*, void* hint) { delete static_cast<std::shared_ptr<const void>*>(hint); }

// Bytes of a frame handed to ZeroMQ without a copy: the frame's owner lives until libzmq is
// done with them (after the wire write, or after CURVE has encrypted them).
::zmq::message_t slice(const Frame& frame, std::size_t offset, std::size_t size) {
  if (size < kZeroCopyMinBytes || !frame.owner()) {
    return ::zmq::message_t(frame.data() + offset, size);
  }
  auto hold = std::make_unique<std::shared_ptr<const void>>(frame.owner());
  ::zmq::message_t part(const_cast<std::uint8_t*>(frame.data()) + offset, size, release_owner,
                        hold.get());
  hold.release();
  return part;
}

// [version, kind, u64 extra…, u64 size × n]
::zmq::message_t header(Kind kind, const std::vector<std::uint64_t>& extra, const Message* sizes) {
  const std::size_t n = sizes ? sizes->size() : 0;
  ::zmq::message_t h(2 + 8 * (extra.size() + n));
  auto* out = h.data<std::uint8_t>();
  out[0] = kWireVersion;
  out[1] = kind;
  std::size_t at = 2;
  for (const std::uint64_t v : extra) {
    put_u64(out + at, v);
    at += 8;
  }
  for (std::size_t i = 0; i < n; ++i) {
    put_u64(out + at, (*sizes)[i].size());
    at += 8;
  }
  return h;
}

Frame adopt(::zmq::message_t&& part) {
  if (part.size() < kZeroCopyMinBytes) return Frame::copy_of(part.data(), part.size());
  auto holder = std::make_shared<::zmq::message_t>(std::move(part));
  const auto* data = holder->data<std::uint8_t>();  // after the move: small messages are inline
  const std::size_t size = holder->size();
  return Frame(std::move(holder), data, size);
}

// Memory backed by huge pages where the kernel allows: a fresh 64 MiB buffer otherwise takes
// 16384 page faults, which on the project's VMs cost more than decrypting it.
// A frame under a huge page gets plain memory of its own size.
std::shared_ptr<std::uint8_t> frame_buffer(std::size_t size) {
  if (size < kHugePage) {
    auto* small = static_cast<std::uint8_t*>(std::malloc(std::max<std::size_t>(size, 1)));
    XLOCO_ENFORCE(small != nullptr, TransportError, "cannot allocate {} bytes for a frame", size);
    return std::shared_ptr<std::uint8_t>(small, std::free);
  }
  const std::size_t capacity = (size + kHugePage - 1) / kHugePage * kHugePage;
  auto* bytes = static_cast<std::uint8_t*>(std::aligned_alloc(kHugePage, capacity));
  XLOCO_ENFORCE(bytes != nullptr, TransportError, "cannot allocate {} bytes for a frame", size);
  (void)::madvise(bytes, capacity, MADV_HUGEPAGE);  // a hint; without THP it is plain memory
  return std::shared_ptr<std::uint8_t>(bytes, std::free);
}

// Sends `parts` as one ZeroMQ message without waiting. Only the first part can block or fail
// to route: libzmq checks the high-water mark and the peer at message boundaries.
UnitStatus send_parts(::zmq::socket_t& socket, std::vector<::zmq::message_t>& parts) {
  for (std::size_t i = 0; i < parts.size(); ++i) {
    auto flags = ::zmq::send_flags::dontwait;
    if (i + 1 < parts.size()) flags = flags | ::zmq::send_flags::sndmore;
    std::optional<std::size_t> sent;
    try {
      sent = socket.send(parts[i], flags);
    } catch (const ::zmq::error_t& e) {
      if (i == 0 && e.num() == EHOSTUNREACH) return UnitStatus::kNoPeer;
      throw TransportError(fmt::format("send failed: {}", e.what()));
    }
    if (!sent) {
      XLOCO_ENFORCE(i == 0, TransportError, "send blocked after the first part of a message");
      return UnitStatus::kBlocked;
    }
  }
  return UnitStatus::kTaken;
}

}  // namespace

bool fits_one_chunk(const Message& message) {
  std::size_t total = 0;
  for (const Frame& f : message) total += f.size();
  return total <= kChunkBytes;
}

UnitResult send_unit(::zmq::socket_t& socket, const std::string* routing_id, Outbox::Item& item,
                     std::uint64_t stream) {
  std::vector<::zmq::message_t> parts;
  if (routing_id) parts.emplace_back(*routing_id);
  UnitResult result;
  if (fits_one_chunk(item.message)) {
    parts.push_back(header(kWhole, {}, &item.message));
    for (const Frame& f : item.message) parts.push_back(slice(f, 0, f.size()));
    result = {UnitStatus::kTaken, item.bytes, true};
  } else if (!item.started) {
    parts.push_back(header(kStart, {stream}, &item.message));
    result = {UnitStatus::kTaken, 0, false};
  } else {
    // The chunk at item.taken: chunks never cross a frame's end.
    std::size_t offset = item.taken;
    std::size_t f = 0;
    while (offset >= item.message[f].size()) offset -= item.message[f++].size();
    const std::size_t n = std::min(kChunkBytes, item.message[f].size() - offset);
    parts.push_back(header(kChunk, {stream, item.taken}, nullptr));
    parts.push_back(slice(item.message[f], offset, n));
    result = {UnitStatus::kTaken, n, item.taken + n == item.bytes};
  }
  result.status = send_parts(socket, parts);
  return result;
}

void Reassembly::reset() {
  active_ = false;
  refused_.reset();
  sizes_.clear();
  buffers_.clear();
  total_ = received_ = 0;
}

std::optional<Message> Reassembly::take(std::vector<::zmq::message_t>& parts, std::size_t first,
                                        std::int64_t max_frame_bytes, std::string& error,
                                        std::int64_t max_frames) {
  const std::size_t frames_cap =
      max_frames < 0 ? kMaxStreamFrames
                     : std::min(kMaxStreamFrames, static_cast<std::size_t>(max_frames));
  error.clear();
  if (first >= parts.size() || parts[first].size() < 2) {
    error = "no header part";
    return std::nullopt;
  }
  const auto* in = parts[first].data<std::uint8_t>();
  const std::size_t size = parts[first].size();
  if (in[0] != kWireVersion) {
    error = fmt::format("wire format version {}, this end speaks {}", in[0], kWireVersion);
    return std::nullopt;
  }
  const std::size_t extra_parts = parts.size() - first - 1;
  if (in[1] == kStart) return start(in, size, extra_parts, max_frame_bytes, frames_cap, error);
  if (in[1] == kChunk) return chunk(in, size, parts, first, error);
  if (in[1] != kWhole || size < 10 || (size - 2) % 8 != 0 || (size - 2) / 8 != extra_parts) {
    error = fmt::format("malformed header part ({} bytes, {} parts)", size, extra_parts);
    return std::nullopt;
  }
  if (extra_parts > frames_cap) {
    error = fmt::format("a message of {} frames; this end takes at most {}", extra_parts, frames_cap);
    return std::nullopt;
  }
  std::size_t total = 0;
  for (std::size_t i = 0; i < extra_parts; ++i) {
    const std::uint64_t declared = get_u64(in + 2 + 8 * i);
    total += parts[first + 1 + i].size();
    if (declared != parts[first + 1 + i].size() || total > kChunkBytes) {
      error = "a part's size does not match its header, or the message is over one chunk";
      return std::nullopt;
    }
  }
  Message message;
  message.reserve(extra_parts);
  for (std::size_t i = 0; i < extra_parts; ++i) message.push_back(adopt(std::move(parts[first + 1 + i])));
  return message;
}

std::optional<Message> Reassembly::start(const std::uint8_t* in, std::size_t size,
                                         std::size_t parts, std::int64_t max_frame_bytes,
                                         std::size_t max_frames, std::string& error) {
  if (size < 18 || (size - 10) % 8 != 0 || parts != 0) {
    error = fmt::format("malformed stream start ({} bytes, {} parts)", size, parts);
    return std::nullopt;
  }
  if (active_) {
    error = fmt::format("stream {} ended unfinished after {} of {} bytes: a new one began",
                        stream_, received_, total_);
  }
  reset();
  const std::size_t n = (size - 10) / 8;
  if (n > max_frames) {
    error = fmt::format("a stream of {} frames; this end takes at most {}", n, max_frames);
    refused_ = get_u64(in + 2);
    return std::nullopt;
  }
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t s = get_u64(in + 10 + 8 * i);
    if (max_frame_bytes >= 0 && s > static_cast<std::uint64_t>(max_frame_bytes)) {
      error = fmt::format("a frame of {} bytes is over max_frame_bytes ({})", s, max_frame_bytes);
      reset();
      refused_ = get_u64(in + 2);
      return std::nullopt;
    }
    total += s;
    sizes_.push_back(s);
  }
  if (max_frame_bytes >= 0 && total > static_cast<std::uint64_t>(max_frame_bytes) + kChunkBytes) {
    error = fmt::format("a stream of {} bytes is over max_frame_bytes ({}) and a header",
                        total, max_frame_bytes);
    reset();
    refused_ = get_u64(in + 2);
    return std::nullopt;
  }
  stream_ = get_u64(in + 2);
  total_ = total;
  buffers_.resize(n);
  active_ = true;
  if (total_ > 0) return std::nullopt;
  Message empty(n);
  reset();
  return empty;
}

std::optional<Message> Reassembly::chunk(const std::uint8_t* in, std::size_t size,
                                         std::vector<::zmq::message_t>& parts, std::size_t first,
                                         std::string& error) {
  if (size != 18 || parts.size() != first + 2) {
    error = "malformed chunk";
    reset();
    return std::nullopt;
  }
  const std::uint64_t stream = get_u64(in + 2);
  const std::uint64_t offset = get_u64(in + 10);
  ::zmq::message_t& data = parts[first + 1];
  if (!active_ && refused_ == stream) {
    ++skipped_;  // its START was refused and said so; the rest of it goes quietly
    return std::nullopt;
  }
  if (!active_ || stream != stream_ || offset != received_ || data.size() == 0 ||
      data.size() > kChunkBytes) {
    error = active_ ? fmt::format("chunk of stream {} at {} (+{}) does not continue stream {} at {}",
                                  stream, offset, data.size(), stream_, received_)
                    : fmt::format("chunk of stream {} with no stream started", stream);
    reset();
    refused_ = stream;  // the rest of it goes quietly
    return std::nullopt;
  }
  std::size_t f = 0;
  std::uint64_t at = offset;
  while (at >= sizes_[f]) at -= sizes_[f++];
  if (at + data.size() > sizes_[f]) {
    error = "a chunk crosses the end of its frame";
    reset();
    return std::nullopt;
  }
  if (!buffers_[f]) buffers_[f] = frame_buffer(sizes_[f]);
  std::memcpy(buffers_[f].get() + at, data.data(), data.size());
  received_ += data.size();
  data.rebuild();  // the chunk is freed once copied: the frame is never held twice
  if (received_ < total_) return std::nullopt;
  Message message;
  message.reserve(sizes_.size());
  for (std::size_t i = 0; i < sizes_.size(); ++i) {
    if (sizes_[i] == 0) {
      message.emplace_back();
    } else {
      const std::uint8_t* bytes = buffers_[i].get();
      message.emplace_back(std::move(buffers_[i]), bytes, sizes_[i]);
    }
  }
  reset();
  return message;
}

}  // namespace xloco::net::zeromq
