#include "net/frame.h"

#include <cstring>

namespace xloco::net {

Frame::Frame(std::vector<std::uint8_t> bytes) {
  auto owned = std::make_shared<const std::vector<std::uint8_t>>(std::move(bytes));
  data_ = owned->data();
  size_ = owned->size();
  owner_ = std::move(owned);
}

Frame::Frame(std::string_view text)
    : Frame(std::vector<std::uint8_t>(text.begin(), text.end())) {}

Frame::Frame(std::shared_ptr<const void> owner, const std::uint8_t* data, std::size_t size)
    : owner_(std::move(owner)), data_(data), size_(size) {}

Frame Frame::copy_of(const void* data, std::size_t size) {
  const auto* bytes = static_cast<const std::uint8_t*>(data);
  return Frame(std::vector<std::uint8_t>(bytes, bytes + size));
}

bool operator==(const Frame& a, const Frame& b) noexcept {
  return a.size_ == b.size_ && (a.data_ == b.data_ || a.size_ == 0 ||
                                std::memcmp(a.data_, b.data_, a.size_) == 0);
}

}  // namespace xloco::net
