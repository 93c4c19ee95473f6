// Rate limits for warnings that a peer can provoke (failed handshakes, refused messages): at
// most `burst` lines per key in each window of `window_s`, and the first line after a window
// with lines held back says how many. A pure rule over (now, its counters): no clock or logger
// of its own, so a hostile peer cannot fill the disk with logs and tests need no sleeping.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace xloco::common {

class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  explicit LogLimiter(int burst = 5, double window_s = 60) : burst_(burst), window_(window_s) {}

  struct Verdict {
    bool log = true;
    uint64_t held_back = 0;  // lines about this key not logged since the last one that was
  };
  Verdict check(const std::string& key, Clock::time_point now = Clock::now()) {
    if (keys_.size() > 4096) keys_.clear();  // many keys (addresses): forget the old ones
    Key& k = keys_[key];
    if (k.count == 0 || std::chrono::duration<double>(now - k.window_start).count() >= window_) {
      k.window_start = now;
      k.count = 0;
    }
    if (++k.count > static_cast<uint64_t>(burst_)) {
      ++k.held_back;
      return {false, 0};
    }
    return {true, std::exchange(k.held_back, 0)};
  }
  // The suffix for a logged line: "" or " (N similar lines held back)".
  static std::string note(const Verdict& v) {
    return v.held_back == 0 ? std::string()
                            : " (" + std::to_string(v.held_back) + " similar lines held back)";
  }

 private:
  struct Key {
    Clock::time_point window_start{};
    uint64_t count = 0, held_back = 0;
  };
  int burst_;
  double window_;
  std::map<std::string, Key> keys_;
};

}  // namespace xloco::common
