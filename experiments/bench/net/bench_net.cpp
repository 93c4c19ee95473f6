// bench_net: what CURVE costs on a link, against the primitive it is built on (design §9:
// CURVE throughput ≥ 0.8× libsodium's raw crypto_box). Same run, same 64 MiB buffer:
//   Memcpy        the memory bandwidth everything else is bounded by
//   BoxSeal/Open  crypto_box_easy_afternm / crypto_box_open_easy_afternm with a precomputed
//                 key: XSalsa20-Poly1305, exactly what CURVE does per message
//   LinkPlain     provider → head over loopback TCP through xloco's ZeroMQ transport
//   LinkCurve     the same with CURVE (sender encrypts, receiver decrypts, on two threads)
// Links keep two messages in flight so that sender and receiver work in parallel, as a
// provider's upload does. Throughput counts payload bytes delivered.
#include <benchmark/benchmark.h>
#include <sodium.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <vector>

#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

#include "net/zmq/transport.h"

namespace xloco::net {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t kMessageBytes = std::size_t{64} << 20;
constexpr int kInFlight = 2;

const std::vector<std::uint8_t>& payload() {
  static const std::vector<std::uint8_t> bytes = [] {
    std::vector<std::uint8_t> b(kMessageBytes);
    randombytes_buf(b.data(), b.size());
    return b;
  }();
  return bytes;
}

void BM_Memcpy(benchmark::State& state) {
  const auto& in = payload();
  std::vector<std::uint8_t> out(in.size());
  for (auto _ : state) {
    std::memcpy(out.data(), in.data(), in.size());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(in.size()));
}

struct BoxKeys {
  unsigned char shared[crypto_box_BEFORENMBYTES];
  unsigned char nonce[crypto_box_NONCEBYTES] = {};
  BoxKeys() {
    unsigned char pk[crypto_box_PUBLICKEYBYTES], sk[crypto_box_SECRETKEYBYTES];
    crypto_box_keypair(pk, sk);
    if (crypto_box_beforenm(shared, pk, sk) != 0) throw std::runtime_error("beforenm");
  }
};

void BM_BoxSeal(benchmark::State& state) {
  const auto& in = payload();
  std::vector<std::uint8_t> out(in.size() + crypto_box_MACBYTES);
  BoxKeys keys;
  for (auto _ : state) {
    crypto_box_easy_afternm(out.data(), in.data(), in.size(), keys.nonce, keys.shared);
    sodium_increment(keys.nonce, sizeof keys.nonce);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(in.size()));
}

void BM_BoxOpen(benchmark::State& state) {
  const auto& in = payload();
  std::vector<std::uint8_t> sealed(in.size() + crypto_box_MACBYTES), out(in.size());
  BoxKeys keys;
  crypto_box_easy_afternm(sealed.data(), in.data(), in.size(), keys.nonce, keys.shared);
  for (auto _ : state) {
    if (crypto_box_open_easy_afternm(out.data(), sealed.data(), sealed.size(), keys.nonce,
                                     keys.shared) != 0) {
      state.SkipWithError("MAC check failed");
      break;
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(in.size()));
}

// CPU time of each thread of this process (from /proc/self/task/*/schedstat, in ns), so a link
// can be charged per thread: the provider's I/O thread (encrypts), the head's I/O thread
// (decrypts), and the application thread. On a shared 2-core machine wall time also counts
// other people's jobs; CPU time per thread does not.
std::map<pid_t, double> thread_cpu_ms() {
  std::map<pid_t, double> cpu;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream in(entry.path() / "schedstat");
    double ns = 0;
    if (in >> ns) cpu[static_cast<pid_t>(std::stol(entry.path().filename().string()))] = ns / 1e6;
  }
  return cpu;
}

std::set<pid_t> new_threads(const std::set<pid_t>& before) {
  std::set<pid_t> added;
  for (const auto& [tid, ms] : thread_cpu_ms()) {
    if (!before.count(tid)) added.insert(tid);
  }
  return added;
}

std::set<pid_t> all_threads() {
  std::set<pid_t> tids;
  for (const auto& [tid, ms] : thread_cpu_ms()) tids.insert(tid);
  return tids;
}

double sum_over(const std::map<pid_t, double>& cpu, const std::set<pid_t>& tids) {
  double total = 0;
  for (pid_t tid : tids) {
    const auto it = cpu.find(tid);
    if (it != cpu.end()) total += it->second;
  }
  return total;
}

void run_link(benchmark::State& state, bool curve) {
  auto quiet = std::make_shared<spdlog::logger>("bench", std::make_shared<spdlog::sinks::null_sink_mt>());
  zeromq::LinkOptions link;
  link.logger = quiet;
  link.linger = 0ms;
  const KeyPair head_key = generate_keypair();
  const KeyPair provider_key = generate_keypair();

  zeromq::ServerOptions server_options;
  server_options.bind = "tcp://127.0.0.1:0";
  server_options.link = link;
  server_options.link.insecure = !curve;
  server_options.key = head_key;
  server_options.allow.add("provider", provider_key.public_key);
  const std::set<pid_t> before_head = all_threads();
  zeromq::Server head(server_options);
  const std::set<pid_t> head_threads = new_threads(before_head);

  zeromq::ClientOptions client_options;
  client_options.connect = head.endpoint();
  client_options.link = server_options.link;
  client_options.server_public_key = head_key.public_key;
  client_options.key = provider_key;
  client_options.name = "provider";
  const std::set<pid_t> before_provider = all_threads();
  zeromq::Client provider(client_options);
  const std::set<pid_t> provider_threads = new_threads(before_provider);
  const std::set<pid_t> app_thread = {static_cast<pid_t>(::syscall(SYS_gettid))};

  const Message message{Frame(std::string_view("header")), Frame(payload())};
  const auto send = [&] {
    if (provider.send(kHeadPeer, message) != SendStatus::kSent) {
      throw std::runtime_error("send failed");
    }
  };
  const auto receive = [&] {
    auto got = head.receive(60s);
    if (!got || got->message.size() != 2 || got->message[1].size() != kMessageBytes) {
      throw std::runtime_error("receive failed");
    }
  };
  send();  // connect, handshake and warm the allocator before timing
  receive();

  for (int i = 0; i < kInFlight; ++i) send();
  const auto cpu_before = thread_cpu_ms();
  for (auto _ : state) {
    receive();
    send();
  }
  const auto cpu_after = thread_cpu_ms();
  for (int i = 0; i < kInFlight; ++i) receive();
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(kMessageBytes));
  const double n = static_cast<double>(state.iterations());
  const auto per_message = [&](const std::set<pid_t>& tids) {
    return (sum_over(cpu_after, tids) - sum_over(cpu_before, tids)) / n;
  };
  // Milliseconds of CPU per 64 MiB message, by thread.
  state.counters["send_io_ms"] = per_message(provider_threads);
  state.counters["recv_io_ms"] = per_message(head_threads);
  state.counters["app_ms"] = per_message(app_thread);
}

void BM_LinkPlain(benchmark::State& state) { run_link(state, false); }
void BM_LinkCurve(benchmark::State& state) { run_link(state, true); }

BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_BoxSeal)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_BoxOpen)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_LinkPlain)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
BENCHMARK(BM_LinkCurve)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);

}  // namespace
}  // namespace xloco::net

int main(int argc, char** argv) {
  if (sodium_init() < 0) return 1;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
