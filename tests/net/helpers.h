// Shared by the net test files: a log sink to assert on, a temporary directory, payloads, and
// the two backends that the same transport tests run over.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <spdlog/logger.h>
#include <spdlog/sinks/base_sink.h>

#include "net/inproc/transport.h"
#include "net/keys.h"
#include "net/transport.h"
#include "net/zmq/transport.h"

namespace xloco::net::test {

using namespace std::chrono_literals;

// Keeps every formatted line; wait_for() blocks until a line contains the text (no sleeps).
class CaptureSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  bool wait_for(const std::string& text, std::chrono::milliseconds timeout);
  std::size_t count(const std::string& text);
  std::string all();

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override;
  void flush_() override {}

 private:
  std::vector<std::string> lines_;
  std::condition_variable_any added_;
};

struct Capture {
  Capture();
  std::shared_ptr<CaptureSink> sink;
  std::shared_ptr<spdlog::logger> logger;
};

class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// This process's resident memory now (VmRSS) and its peak since reset_peak_resident()
// (VmHWM, reset through /proc/self/clear_refs).
std::int64_t resident_bytes();
std::int64_t peak_resident_bytes();
void reset_peak_resident();

// Deterministic bytes that differ at every offset, so a shifted or truncated copy is caught.
std::vector<std::uint8_t> pattern(std::size_t size, std::uint64_t seed);

// The head and its providers over one backend. Providers are named alice, bob, carol, …
// (over ZeroMQ each has its own allow-listed CURVE key).
class ZmqBackend {
 public:
  static constexpr const char* kName = "zmq";
  ZmqBackend();
  Transport& head() { return *head_; }
  std::unique_ptr<Transport> provider(const std::string& name);
  Capture& capture() { return capture_; }

  static zeromq::LinkOptions test_link(const Capture& capture);

 private:
  Capture capture_;
  KeyPair head_key_;
  std::map<std::string, KeyPair> keys_;
  std::unique_ptr<zeromq::Server> head_;
};

class InprocBackend {
 public:
  static constexpr const char* kName = "inproc";
  InprocBackend() : network_(inproc::Network::create()), head_(network_->listen()) {}
  Transport& head() { return *head_; }
  std::unique_ptr<Transport> provider(const std::string& name) { return network_->connect(name); }

 private:
  std::shared_ptr<inproc::Network> network_;
  std::unique_ptr<Transport> head_;
};

inline constexpr std::chrono::milliseconds kPatience = 20s;  // for what must happen
inline constexpr std::chrono::milliseconds kQuiet = 300ms;   // for what must not

}  // namespace xloco::net::test
