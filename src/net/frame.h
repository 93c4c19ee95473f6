// Frame: the bytes of one part of a multipart message, immutable and shared. Copying a Frame
// copies a pointer, so the head can broadcast one update to K providers, and a transport can
// hand the bytes to ZeroMQ or take them back from it, without copying 64 MiB each time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace xloco::net {

class Frame {
 public:
  Frame() = default;
  // Takes the vector over without copying its bytes.
  explicit Frame(std::vector<std::uint8_t> bytes);
  // Copies the text (headers are small).
  explicit Frame(std::string_view text);
  // Bytes owned elsewhere (e.g. a received ZeroMQ message), kept alive by `owner`.
  Frame(std::shared_ptr<const void> owner, const std::uint8_t* data, std::size_t size);

  static Frame copy_of(const void* data, std::size_t size);

  const std::uint8_t* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  std::string_view view() const noexcept {
    return {reinterpret_cast<const char*>(data_), size_};
  }
  std::vector<std::uint8_t> to_vector() const { return {data_, data_ + size_}; }
  // Whoever keeps this alive keeps data() valid; transports use it for zero-copy hand-off.
  const std::shared_ptr<const void>& owner() const noexcept { return owner_; }

  friend bool operator==(const Frame& a, const Frame& b) noexcept;
  friend bool operator!=(const Frame& a, const Frame& b) noexcept { return !(a == b); }

 private:
  std::shared_ptr<const void> owner_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

// A multipart message: frame 0 is the protocol header, the rest are binary payloads.
using Message = std::vector<Frame>;

}  // namespace xloco::net
