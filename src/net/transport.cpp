#include "net/transport.h"

namespace xloco::net {

const char* to_string(SendStatus status) {
  switch (status) {
    case SendStatus::kSent: return "sent";
    case SendStatus::kNoPeer: return "no such peer";
    case SendStatus::kTimeout: return "timed out";
  }
  return "unknown";
}

}  // namespace xloco::net
