// The one exception the codec throws for bad frames and bad inputs. Frames come from other
// organisations' machines, so callers catch FrameError and drop the contribution; the kind lets
// them (and tests) tell a truncated upload from a hostile or diverged one without parsing text.
#pragma once

#include <string>

#include "common/error.h"

namespace xloco::compress {

enum class FrameErrorKind {
  kTruncated,     // the frame ends before the sizes its header declares
  kBadMagic,      // not an xloco codec frame at all
  kBadVersion,    // a frame format this build does not read
  kUnknownCodec,  // a codec id this build does not know
  kOverLimit,     // a declared count or size exceeds Limits (nothing was allocated for it),
                  // or a value to encode exceeds the codec's range
  kCorrupt,       // sizes disagree with each other, zstd or its checksum failed, bad scale
  kNonFinite,     // NaN or Inf in the input (encode) or in the decoded values (decode)
  kMismatch,      // names, shapes or count differ from the targets (or the residuals)
};

const char* to_string(FrameErrorKind kind);

class FrameError : public common::Error {
 public:
  FrameError(FrameErrorKind kind, const std::string& what)
      : common::Error(std::string(to_string(kind)) + ": " + what), kind_(kind) {}
  FrameErrorKind kind() const { return kind_; }

 private:
  FrameErrorKind kind_;
};

}  // namespace xloco::compress

// XLOCO_FRAME_ENFORCE(cond, kind, "fmt {}", args...) throws FrameError(kind, "msg (file:line)").
#define XLOCO_FRAME_ENFORCE(cond, kind, ...)                                                       \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      throw ::xloco::compress::FrameError(::xloco::compress::FrameErrorKind::kind,                 \
                                          fmt::format(__VA_ARGS__) + " (" +                        \
                                              ::xloco::common::detail::where(__FILE__, __LINE__) + \
                                              ")");                                                \
    }                                                                                              \
  } while (0)
