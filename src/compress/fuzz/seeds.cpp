// Writes a starting corpus for fuzz_decode: valid frames of every codec, raw and zstd.
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "compress/encoder.h"

using namespace xloco::compress;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  std::vector<float> a(300), b(7), c(1);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 37 % 101) - 50) * 1e-3f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i) - 3.5f;
  c[0] = 2.5f;
  const std::vector<ConstTensorRef> in = {
      {"layer.weight", {20, 15}, a.data()}, {"layer.bias", {7}, b.data()}, {"s", {}, c.data()}};
  int written = 0;
  // (codec, value bits): topk twice, 2-bit values, then 4-bit ("topk4-…")
  const std::pair<Codec, uint32_t> kinds[] = {{Codec::kFp32, 2}, {Codec::kBf16, 2},
                                              {Codec::kInt8, 2}, {Codec::kInt4, 2},
                                              {Codec::kTopk, 2}, {Codec::kTopk, 4}};
  for (const auto& [codec, bits] : kinds) {
    for (const int level : {0, 1}) {
      CodecConfig config;
      config.codec = codec;
      config.zstd_level = level;
      config.block_size = 64;
      config.topk = codec == Codec::kTopk ? 4 : 0;
      config.topk_bits = bits;
      const std::vector<uint8_t> frame = Encoder(config).encode(in);
      const std::string path = std::string(argv[1]) + "/" + std::string(to_string(codec)) +
                               (bits == 4 ? "4" : "") + (level != 0 ? "-zstd" : "-raw") + ".xlcf";
      std::ofstream(path, std::ios::binary)
          .write(reinterpret_cast<const char*>(frame.data()), static_cast<long>(frame.size()));
      ++written;
    }
  }
  std::printf("%d frames written to %s\n", written, argv[1]);
  return 0;
}
