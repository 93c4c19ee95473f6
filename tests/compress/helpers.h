// Test data and frame surgery shared by the compress suites: heavy-tailed pseudo-gradients,
// tensor sets that own their buffers, and little-endian patches of frame fields.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "compress/tensor_ref.h"

namespace xloco::compress::testing {

// Student-t with 2 degrees of freedom (infinite variance) clipped at 1e4, scaled per block so
// that absmax varies over blocks as it does between layers; a few blocks are all zero.
inline std::vector<float> heavy_tailed(size_t n, uint64_t seed, float scale = 1e-3f) {
  std::mt19937_64 rng(seed);
  std::student_t_distribution<float> t(2.0f);
  std::uniform_real_distribution<float> block_scale(0.01f, 10.0f);
  std::vector<float> v(n);
  float s = scale;
  for (size_t i = 0; i < n; ++i) {
    if (i % 97 == 0) s = scale * block_scale(rng);
    const float x = t(rng);
    v[i] = s * (x > 1e4f ? 1e4f : (x < -1e4f ? -1e4f : x));
  }
  for (size_t i = 300; i < n && i < 700; ++i) v[i] = 0.0f;
  return v;
}

// Named tensors that own their storage.
struct TensorSet {
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  std::vector<std::vector<float>> data;

  void add(std::string name, Shape shape, std::vector<float> values) {
    names.push_back(std::move(name));
    shapes.push_back(std::move(shape));
    data.push_back(std::move(values));
  }
  std::vector<ConstTensorRef> inputs() const {
    std::vector<ConstTensorRef> r;
    for (size_t i = 0; i < names.size(); ++i) r.push_back({names[i], shapes[i], data[i].data()});
    return r;
  }
  std::vector<TensorRef> targets() {
    std::vector<TensorRef> r;
    for (size_t i = 0; i < names.size(); ++i) r.push_back({names[i], shapes[i], data[i].data()});
    return r;
  }
  // Same names and shapes, buffers filled with `fill`.
  TensorSet like(float fill) const {
    TensorSet s = *this;
    for (auto& d : s.data) std::fill(d.begin(), d.end(), fill);
    return s;
  }
};

// A small model-like set: odd sizes, a scalar, an empty tensor, a partial last block.
inline TensorSet model_like(uint64_t seed, float scale = 1e-3f) {
  TensorSet s;
  s.add("transformer.wte.weight", {256, 33}, heavy_tailed(256 * 33, seed, scale));
  s.add("transformer.h.0.ln_1.weight", {129}, heavy_tailed(129, seed + 1, scale));
  s.add("transformer.h.0.attn.c_attn.weight", {3, 7, 61},
        heavy_tailed(3 * 7 * 61, seed + 2, scale));
  s.add("scalar", {}, heavy_tailed(1, seed + 3, scale));
  s.add("empty", {0, 5}, {});
  return s;
}

template <typename T>
void put(std::vector<uint8_t>& frame, size_t offset, T value) {
  std::memcpy(frame.data() + offset, &value, sizeof(T));
}

template <typename T>
T get(const std::vector<uint8_t>& frame, size_t offset) {
  T v;
  std::memcpy(&v, frame.data() + offset, sizeof(T));
  return v;
}

}  // namespace xloco::compress::testing
