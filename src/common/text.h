// Text that came from a peer, a file or a user, made safe to quote (design §10, isolation).
// `printable` keeps printable ASCII and writes every other byte as \xNN (a backslash as \\), and
// cuts what is longer than `max_bytes` with a note of how much was cut: the result is printable
// ASCII, so it is valid UTF-8 for JSON, holds no terminal escape or newline for a log line, and is
// bounded. Header-only and dependency-free: the torch-free codec core quotes names with it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace xloco::common {

inline std::string printable(std::string_view s, std::size_t max_bytes = 256) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() < max_bytes ? s.size() : max_bytes);
  std::size_t i = 0;
  for (; i < s.size() && out.size() < max_bytes; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\\') {
      out += "\\\\";
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (i < s.size()) out += "...(" + std::to_string(s.size() - i) + " more bytes)";
  return out;
}

// True when every byte is printable ASCII (what names of tensors, providers and keys are).
inline bool is_printable(std::string_view s) {
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c >= 0x7f) return false;
  }
  return true;
}

// `s` as one POSIX shell word, safe to paste: as it is when it holds only characters no shell
// treats specially (letters, digits, _@%+=:,./-), otherwise in single quotes (a quote inside
// written '\''). Z85 keys hold & < > $ ! and would otherwise background, redirect or expand.
inline std::string shell_quote(std::string_view s) {
  bool plain = !s.empty();
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    const bool safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      std::string_view("_@%+=:,./-").find(ch) != std::string_view::npos;
    plain = plain && safe;
  }
  if (plain) return std::string(s);
  std::string out = "'";
  for (const char ch : s) {
    if (ch == '\'') {
      out += "'\\''";
    } else {
      out += ch;
    }
  }
  return out + "'";
}

}  // namespace xloco::common
