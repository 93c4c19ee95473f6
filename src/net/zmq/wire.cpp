#include "net/zmq/wire.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "net/errors.h"
#include "net/zmq/options.h"

namespace xloco::net::zeromq {
namespace {

constexpr std::uint8_t kLayoutVersion = 1;
// Below this a part is copied: one small memcpy is cheaper than a shared_ptr hand-off.
constexpr std::size_t kZeroCopyMinBytes = 4096;
constexpr std::size_t kHugePage = std::size_t{2} << 20;

std::size_t parts_of(std::uint64_t frame_size) {
  return static_cast<std::size_t>(frame_size / kChunkBytes + (frame_size % kChunkBytes != 0));
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

::zmq::message_t layout_of(const Message& message) {
  ::zmq::message_t layout(1 + 8 * message.size());
  auto* out = layout.data<std::uint8_t>();
  out[0] = kLayoutVersion;
  for (std::size_t i = 0; i < message.size(); ++i) {
    const std::uint64_t size = message[i].size();
    for (int b = 0; b < 8; ++b) out[1 + 8 * i + b] = static_cast<std::uint8_t>(size >> (8 * b));
  }
  return layout;
}

Frame adopt(::zmq::message_t&& part) {
  if (part.size() < kZeroCopyMinBytes) return Frame::copy_of(part.data(), part.size());
  auto holder = std::make_shared<::zmq::message_t>(std::move(part));
  const auto* data = holder->data<std::uint8_t>();  // after the move: small messages are inline
  const std::size_t size = holder->size();
  return Frame(std::move(holder), data, size);
}

// One copy into memory backed by huge pages where the kernel allows: a fresh 64 MiB buffer
// otherwise takes 16384 page faults, which on the project's VMs cost more than decrypting it.
Frame assemble(std::vector<::zmq::message_t>& parts, std::size_t first, std::size_t size) {
  const std::size_t capacity = (size + kHugePage - 1) / kHugePage * kHugePage;
  auto* bytes = static_cast<std::uint8_t*>(std::aligned_alloc(kHugePage, capacity));
  XLOCO_ENFORCE(bytes != nullptr, TransportError, "cannot allocate {} bytes for a frame", size);
  std::shared_ptr<std::uint8_t> owner(bytes, std::free);
  (void)::madvise(bytes, capacity, MADV_HUGEPAGE);  // a hint; without THP it is plain memory
  std::size_t offset = 0;
  for (std::size_t i = first; offset < size; ++i) {
    std::memcpy(bytes + offset, parts[i].data(), parts[i].size());
    offset += parts[i].size();
    parts[i].rebuild();  // each part is freed once copied: the frame is never held twice
  }
  return Frame(std::move(owner), bytes, size);
}

}  // namespace

SendStatus send_message(::zmq::socket_t& socket, const std::string* routing_id,
                        const Message& message) {
  XLOCO_ENFORCE(!message.empty(), NetError, "cannot send a message without frames");
  std::size_t total = (routing_id ? 1 : 0) + 1;
  for (const Frame& frame : message) total += parts_of(frame.size());
  std::size_t sent_parts = 0;
  const auto send_part = [&](::zmq::message_t part) {
    const bool first = sent_parts == 0;
    const auto flags =
        ++sent_parts < total ? ::zmq::send_flags::sndmore : ::zmq::send_flags::none;
    std::optional<std::size_t> sent;
    try {
      sent = socket.send(part, flags);
    } catch (const ::zmq::error_t& e) {
      if (first && e.num() == EHOSTUNREACH) return SendStatus::kNoPeer;
      throw TransportError(fmt::format("send failed: {}", e.what()));
    }
    if (sent) return SendStatus::kSent;
    XLOCO_ENFORCE(first, TransportError, "send blocked after the first part of a message");
    return SendStatus::kTimeout;
  };

  if (routing_id) {
    const SendStatus status = send_part(::zmq::message_t(*routing_id));
    if (status != SendStatus::kSent) return status;
  }
  const SendStatus status = send_part(layout_of(message));
  if (status != SendStatus::kSent) return status;
  for (const Frame& frame : message) {
    for (std::size_t offset = 0; offset < frame.size(); offset += kChunkBytes) {
      (void)send_part(slice(frame, offset, std::min(kChunkBytes, frame.size() - offset)));
    }
  }
  return SendStatus::kSent;
}

std::optional<Message> unpack_message(std::vector<::zmq::message_t>& parts, std::size_t first,
                                      std::int64_t max_frame_bytes, std::string& error) {
  if (first >= parts.size()) {
    error = "no layout part";
    return std::nullopt;
  }
  const ::zmq::message_t& layout = parts[first];
  const auto* in = layout.data<std::uint8_t>();
  if (layout.size() < 9 || (layout.size() - 1) % 8 != 0 || in[0] != kLayoutVersion) {
    error = fmt::format("malformed layout part ({} bytes)", layout.size());
    return std::nullopt;
  }
  std::vector<std::uint64_t> sizes((layout.size() - 1) / 8, 0);
  const std::size_t available = parts.size() - first - 1;
  std::size_t expected = 0;
  for (std::size_t i = 0; i < sizes.size() && expected <= available; ++i) {
    for (int b = 0; b < 8; ++b) sizes[i] |= std::uint64_t{in[1 + 8 * i + b]} << (8 * b);
    if (max_frame_bytes >= 0 && sizes[i] > static_cast<std::uint64_t>(max_frame_bytes)) {
      error = fmt::format("a frame of {} bytes is over max_frame_bytes ({})", sizes[i],
                          max_frame_bytes);
      return std::nullopt;
    }
    expected += parts_of(sizes[i]);
  }
  if (expected != available) {
    error = fmt::format("the layout does not match the {} parts received", available);
    return std::nullopt;
  }
  Message message;
  message.reserve(sizes.size());
  std::size_t next = first + 1;
  for (const std::uint64_t size : sizes) {
    const std::size_t count = parts_of(size);
    for (std::size_t k = 0; k < count; ++k) {
      const std::size_t want = k + 1 < count ? kChunkBytes : size - k * kChunkBytes;
      if (parts[next + k].size() != want) {
        error = "a part's size does not match the layout";
        return std::nullopt;
      }
    }
    if (count == 0) {
      message.emplace_back();
    } else if (count == 1) {
      message.push_back(adopt(std::move(parts[next])));
    } else {
      message.push_back(assemble(parts, next, static_cast<std::size_t>(size)));
    }
    next += count;
  }
  return message;
}

}  // namespace xloco::net::zeromq
