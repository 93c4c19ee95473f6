#include "inner/kernels.h"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/torch.h>
#include <torch/version.h>

namespace xloco::inner {
namespace {

// Query rows per tile (64 measured fastest against 32 and 128 by bench_attention at T = 128 and
// 1024): S and dP are kBlock × T floats per thread (64 KiB each at T = 256), and
// the causal prefix of a block is all that is multiplied (3/4 of T×T at T = 128, → 1/2 as T grows).
constexpr int kBlock = 64;

// Fortran BLAS (any: OpenBLAS, MKL, the reference), as LibTorch itself declares it.
using Sgemm = void (*)(const char*, const char*, const int*, const int*, const int*, const float*,
                       const float*, const int*, const float*, const int*, const float*, float*,
                       const int*);

Sgemm blas_sgemm() {
  static const Sgemm fn = reinterpret_cast<Sgemm>(::dlsym(RTLD_DEFAULT, "sgemm_"));
  return fn;
}

// Row-major C[M×N] = alpha·op(A)·op(B) + beta·C, op(A) M×K, op(B) K×N, leading dimensions in
// elements. Column-major BLAS sees the transposes: Cᵀ = op(B)ᵀ·op(A)ᵀ.
void gemm_rm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
             const float* B, int ldb, float beta, float* C, int ldc) {
  const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
  blas_sgemm()(&tb, &ta, &N, &M, &K, &alpha, B, &ldb, A, &lda, &beta, C, &ldc);
}

// exp for the softmax tiles, written so that the loops below vectorise (Cephes' expf: range
// reduction by ln 2, degree-6 polynomial, scale by 2^n through the exponent bits; no branches,
// no libm calls, bit casts instead of memcpy); max relative error ~2 ulp on [-87, 88], inputs
// below clamp to exp(-87.3) ≈ 1e-38.
__attribute__((always_inline)) inline float exp_tile(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.7f ? 88.7f : x;
  // Adding and subtracting 1.5·2^23 rounds to the nearest integer (|x·log2 e| < 2^22).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  return __builtin_bit_cast(float, __builtin_bit_cast(int32_t, y) + (static_cast<int32_t>(n) << 23));
}

// exp(t) for t ≤ 0, exactly 0 below e^-44 ≈ 8e-20 (which no fp32 sum of a row that holds a 1
// can see). Without the cut, sharp attention rows fill P with values near exp_tile's clamp and
// dS = P∘(...) with their products, subnormal floats that cost x86 a microcode assist each in
// every later product: a provider ran 4× slower after 120 steps (the rogue test, d 256).
__attribute__((always_inline)) inline float prob(float t) {
  const float e = exp_tile(t);
  return t < -44.0f ? 0.0f : e;
}

// Forward tile: rows [row0, row0 + rows) of S (ld = kend) become exp(scale·S − row max), zero
// past the diagonal; inv_sum[r] = 1 / Σ (applied to the rows of P·V, T/hs times fewer values
// than P); lse[r] = log Σ exp(scale·s).
__attribute__((target_clones("avx512f", "avx2", "default")))
void softmax_tile(float* S, int rows, int kend, int row0, float scale, float* lse,
                  float* inv_sum) {
  for (int r = 0; r < rows; ++r) {
    float* s = S + static_cast<int64_t>(r) * kend;
    const int n = row0 + r + 1;
    float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
    for (int j = 0; j < n; ++j) m = s[j] > m ? s[j] : m;
    const float ms = m * scale;
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; ++j) {
      const float p = prob(s[j] * scale - ms);
      s[j] = p;
      sum += p;
    }
    std::fill(s + n, s + kend, 0.f);
    inv_sum[r] = 1.f / sum;
    lse[r] = ms + std::log(sum);
  }
}

// y[r, 0:hs] *= f[r] for rows of a strided [rows, hs] block.
__attribute__((target_clones("avx512f", "avx2", "default")))
void scale_rows(float* y, int rows, int hs, int ld, const float* f) {
  for (int r = 0; r < rows; ++r) {
    float* yr = y + static_cast<int64_t>(r) * ld;
    const float k = f[r];
#pragma omp simd
    for (int j = 0; j < hs; ++j) yr[j] *= k;
  }
}

// Backward tile: S becomes P = exp(scale·S − lse) (zero past the diagonal) and dP becomes
// dS = P∘(dP − D)·scale, D[r] = Σ dY∘Y over the row.
__attribute__((target_clones("avx512f", "avx2", "default")))
void softmax_grad_tile(float* S, float* dP, int rows, int kend, int row0, float scale,
                       const float* lse, const float* D) {
  for (int r = 0; r < rows; ++r) {
    float* s = S + static_cast<int64_t>(r) * kend;
    float* dp = dP + static_cast<int64_t>(r) * kend;
    const int n = row0 + r + 1;
    const float l = lse[r], d = D[r];
#pragma omp simd
    for (int j = 0; j < n; ++j) {
      const float p = prob(s[j] * scale - l);
      s[j] = p;
      dp[j] = p * (dp[j] - d) * scale;
    }
    std::fill(s + n, s + kend, 0.f);
    std::fill(dp + n, dp + kend, 0.f);
  }
}

__attribute__((target_clones("avx512f", "avx2", "default")))
float dot(const float* a, const float* b, int n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

struct Shape {
  int64_t B, T, C, H, hs;
};

Shape shape_of(const torch::Tensor& qkv, int64_t n_head) {
  const int64_t C = qkv.size(2) / 3;
  return {qkv.size(0), qkv.size(1), C, n_head, C / n_head};
}

std::vector<torch::Tensor> attention_forward(const torch::Tensor& qkv, int64_t n_head) {
  const Shape s = shape_of(qkv, n_head);
  auto y = torch::empty({s.B, s.T, s.C}, qkv.options());
  auto lse = torch::empty({s.B, s.H, s.T}, qkv.options());
  const float* base = qkv.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  float* lp = lse.data_ptr<float>();
  const int T = static_cast<int>(s.T), hs = static_cast<int>(s.hs), C = static_cast<int>(s.C),
            C3 = 3 * C;
  const float scale = 1.f / std::sqrt(static_cast<float>(s.hs));
  at::parallel_for(0, s.B * s.H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> S(static_cast<size_t>(std::min(kBlock, T)) * T), inv(kBlock);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.H, h = bh % s.H;
      const float* q = base + b * s.T * C3 + h * s.hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* yb = yp + b * s.T * C + h * s.hs;
      for (int i0 = 0; i0 < T; i0 += kBlock) {
        const int rows = std::min(kBlock, T - i0), kend = i0 + rows;
        gemm_rm(false, true, rows, kend, hs, 1.f, q + int64_t(i0) * C3, C3, k, C3, 0.f, S.data(), kend);
        softmax_tile(S.data(), rows, kend, i0, scale, lp + bh * s.T + i0, inv.data());
        gemm_rm(false, false, rows, hs, kend, 1.f, S.data(), kend, v, C3, 0.f, yb + int64_t(i0) * C, C);
        scale_rows(yb + int64_t(i0) * C, rows, hs, C, inv.data());
      }
    }
  });
  return {y, lse};
}

torch::Tensor attention_backward(const torch::Tensor& qkv, const torch::Tensor& y,
                                 const torch::Tensor& lse, const torch::Tensor& dy,
                                 int64_t n_head) {
  const Shape s = shape_of(qkv, n_head);
  // Every element is written: dQ rows by their own block; dK and dV rows [i0, kend) first by
  // block i0 (beta = 0), then accumulated by the later blocks (beta = 1). No zero-fill pass.
  auto dqkv = torch::empty_like(qkv);
  const float* base = qkv.data_ptr<float>();
  const float* yp = y.data_ptr<float>();
  const float* dyp = dy.data_ptr<float>();
  const float* lp = lse.data_ptr<float>();
  float* dbase = dqkv.data_ptr<float>();
  const int T = static_cast<int>(s.T), hs = static_cast<int>(s.hs), C = static_cast<int>(s.C),
            C3 = 3 * C;
  const float scale = 1.f / std::sqrt(static_cast<float>(s.hs));
  at::parallel_for(0, s.B * s.H, 1, [&](int64_t begin, int64_t end) {
    const size_t tile = static_cast<size_t>(std::min(kBlock, T)) * T;
    std::vector<float> P(tile), dS(tile), D(std::min(kBlock, T));
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.H, h = bh % s.H;
      const int64_t off = b * s.T * C3 + h * s.hs;
      const float *q = base + off, *k = q + C, *v = q + 2 * C;
      float *dq = dbase + off, *dk = dq + C, *dv = dq + 2 * C;
      const int64_t yoff = b * s.T * C + h * s.hs;
      for (int i0 = 0; i0 < T; i0 += kBlock) {
        const int rows = std::min(kBlock, T - i0), kend = i0 + rows;
        const float* dyb = dyp + yoff + int64_t(i0) * C;
        for (int r = 0; r < rows; ++r) D[r] = dot(dyb + int64_t(r) * C, yp + yoff + int64_t(i0 + r) * C, hs);
        gemm_rm(false, true, rows, kend, hs, 1.f, q + int64_t(i0) * C3, C3, k, C3, 0.f, P.data(), kend);
        gemm_rm(false, true, rows, kend, hs, 1.f, dyb, C, v, C3, 0.f, dS.data(), kend);
        softmax_grad_tile(P.data(), dS.data(), rows, kend, i0, scale, lp + bh * s.T + i0, D.data());
        gemm_rm(false, false, rows, hs, kend, 1.f, dS.data(), kend, k, C3, 0.f, dq + int64_t(i0) * C3, C3);
        // dK[0:kend] (+)= dSᵀ·Q_blk and dV[0:kend] (+)= Pᵀ·dY_blk: rows before i0 accumulate,
        // rows of this block are written for the first time.
        const float* qb = q + int64_t(i0) * C3;
        if (i0 > 0) {
          gemm_rm(true, false, i0, hs, rows, 1.f, dS.data(), kend, qb, C3, 1.f, dk, C3);
          gemm_rm(true, false, i0, hs, rows, 1.f, P.data(), kend, dyb, C, 1.f, dv, C3);
        }
        gemm_rm(true, false, rows, hs, rows, 1.f, dS.data() + i0, kend, qb, C3, 0.f,
                dk + int64_t(i0) * C3, C3);
        gemm_rm(true, false, rows, hs, rows, 1.f, P.data() + i0, kend, dyb, C, 0.f,
                dv + int64_t(i0) * C3, C3);
      }
    }
  });
  return dqkv;
}

struct CausalAttention : torch::autograd::Function<CausalAttention> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& qkv,
                               int64_t n_head) {
    auto out = attention_forward(qkv, n_head);
    ctx->save_for_backward({qkv, out[0], out[1]});
    ctx->saved_data["n_head"] = n_head;
    return out[0];
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t n_head = ctx->saved_data["n_head"].toInt();
    auto dqkv = attention_backward(saved[0], saved[1], saved[2], grads[0].contiguous(), n_head);
    return {dqkv, torch::Tensor()};
  }
};

}  // namespace

bool fused_attention_available(const torch::Tensor& qkv) {
  return qkv.device().is_cpu() && qkv.scalar_type() == torch::kFloat32 && qkv.dim() == 3 &&
         qkv.is_contiguous() && qkv.size(1) > 0 && qkv.size(2) < (int64_t{1} << 30) &&
         blas_sgemm() != nullptr;
}

torch::Tensor causal_attention_aten(const torch::Tensor& qkv, int64_t n_head) {
  const Shape s = shape_of(qkv, n_head);
  auto parts = qkv.view({s.B, s.T, 3, s.H, s.hs}).permute({2, 0, 3, 1, 4});
  auto q = parts[0], k = parts[1], v = parts[2];
#if TORCH_VERSION_MAJOR >= 2
  // On a GPU, LibTorch 2.x's fused attention (flash or memory-efficient, as it picks): no T×T
  // tensor in memory. The CPU keeps the ops below, as on LibTorch 1.13.
  if (qkv.is_cuda()) {
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true)
        .transpose(1, 2).reshape({s.B, s.T, s.C});
  }
#endif
  auto mask = torch::ones({s.T, s.T}, qkv.options().dtype(torch::kBool)).triu(1);
  auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(s.hs)));
  att = att.masked_fill(mask, -INFINITY).softmax(-1);
  return torch::matmul(att, v).transpose(1, 2).reshape({s.B, s.T, s.C});
}

torch::Tensor causal_attention(const torch::Tensor& qkv, int64_t n_head) {
  TORCH_CHECK(qkv.dim() == 3 && qkv.size(2) % (3 * n_head) == 0,
              "causal_attention: qkv must be [B, T, 3C] with C divisible by n_head = ", n_head);
  if (!fused_attention_available(qkv)) return causal_attention_aten(qkv, n_head);
  return CausalAttention::apply(qkv, n_head);
}

}  // namespace xloco::inner
