#include "net/transport.h"

namespace xloco::net {

const char* to_string(SendStatus status) {
  switch (status) {
    case SendStatus::kSent: return "sent";
    case SendStatus::kNoPeer: return "no such peer";
    case SendStatus::kFull: return "its queue is full";
  }
  return "unknown";
}

}  // namespace xloco::net
