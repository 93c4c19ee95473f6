#include "helpers.h"

#include <fstream>

#include <cstdlib>
#include <cstring>

#include <spdlog/pattern_formatter.h>

namespace xloco::net::test {

void CaptureSink::sink_it_(const spdlog::details::log_msg& msg) {
  spdlog::memory_buf_t formatted;
  formatter_->format(msg, formatted);
  lines_.emplace_back(formatted.data(), formatted.size());
  added_.notify_all();
}

bool CaptureSink::wait_for(const std::string& text, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return added_.wait_for(lock, timeout, [&] {
    for (const auto& line : lines_) {
      if (line.find(text) != std::string::npos) return true;
    }
    return false;
  });
}

std::size_t CaptureSink::count(const std::string& text) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::size_t n = 0;
  for (const auto& line : lines_) n += line.find(text) != std::string::npos;
  return n;
}

std::string CaptureSink::all() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string text;
  for (const auto& line : lines_) text += line;
  return text;
}

Capture::Capture()
    : sink(std::make_shared<CaptureSink>()),
      logger(std::make_shared<spdlog::logger>("net-test", sink)) {
  logger->set_level(spdlog::level::info);
}

TempDir::TempDir() {
  std::string templ = (std::filesystem::temp_directory_path() / "xloco-net-XXXXXX").string();
  path_ = ::mkdtemp(templ.data());
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

namespace {

std::int64_t status_kb(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  }
  return 0;
}

}  // namespace

std::int64_t resident_bytes() { return status_kb("VmRSS"); }
std::int64_t peak_resident_bytes() { return status_kb("VmHWM"); }
void reset_peak_resident() { std::ofstream("/proc/self/clear_refs") << "5"; }

std::vector<std::uint8_t> pattern(std::size_t size, std::uint64_t seed) {
  std::vector<std::uint8_t> bytes(size);
  std::uint64_t state = seed;
  std::size_t i = 0;
  for (; i + 8 <= size; i += 8) {  // splitmix64
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    std::memcpy(bytes.data() + i, &z, 8);
  }
  for (; i < size; ++i) bytes[i] = static_cast<std::uint8_t>(i * 131 + seed);
  return bytes;
}

zeromq::LinkOptions ZmqBackend::test_link(const Capture& capture) {
  zeromq::LinkOptions link;
  link.linger = 0ms;  // tests close with nothing worth flushing
  link.logger = capture.logger;
  return link;
}

ZmqBackend::ZmqBackend() : head_key_(generate_keypair()) {
  zeromq::ServerOptions options;
  options.bind = "tcp://127.0.0.1:0";
  options.key = head_key_;
  for (const char* name : {"alice", "bob", "carol", "dave"}) {
    keys_[name] = generate_keypair();
    options.allow.add(name, keys_[name].public_key);
  }
  options.link = test_link(capture_);
  head_ = std::make_unique<zeromq::Server>(std::move(options));
}

std::unique_ptr<Transport> ZmqBackend::provider(const std::string& name) {
  zeromq::ClientOptions options;
  options.connect = head_->endpoint();
  options.server_public_key = head_key_.public_key;
  options.key = keys_.at(name);
  options.link = test_link(capture_);
  return std::make_unique<zeromq::Client>(std::move(options));
}

}  // namespace xloco::net::test
