// Errors for all of xloco: one exception base carrying file:line, and the XLOCO_ENFORCE macro
// (Gloo's GLOO_ENFORCE). Modules derive typed errors from common::Error so callers can catch
// what they can handle (a bad frame, a refused peer) and let the rest reach main.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace xloco::common {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A config value or file the user wrote is wrong; the message names the field.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// Something on disk (data set, checkpoint) is missing, truncated or malformed.
class IoError : public Error {
 public:
  using Error::Error;
};

namespace detail {
inline std::string where(const char* file, int line) {
  const std::string f(file);
  const auto slash = f.rfind("src/");
  return fmt::format("{}:{}", slash == std::string::npos ? f : f.substr(slash), line);
}
}  // namespace detail

}  // namespace xloco::common

// XLOCO_ENFORCE(cond, ErrorType, "fmt {}", args...) throws ErrorType("msg (file:line)").
#define XLOCO_ENFORCE(cond, ErrorType, ...)                                               \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      throw ErrorType(fmt::format(__VA_ARGS__) + " (" +                                   \
                      ::xloco::common::detail::where(__FILE__, __LINE__) + ")");          \
    }                                                                                     \
  } while (0)
