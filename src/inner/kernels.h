// Fused CPU kernels for the GPT's inner step (issue 18). LibTorch's causal attention is six
// passes over a B·H·T·T tensor (two batched products, a scale, a mask, a softmax and copies to
// make q, k, v and y contiguous), and as many again backwards. causal_attention() does it per
// (batch, head) and block of query rows, on strided views of the c_attn output:
//   forward:  S = Q·Kᵀ over the causal prefix only; row max, then exp and sum in one pass over
//             the tile; Y = P·V written straight into [B, T, C], each row then divided by its
//             sum (hs values, not T); keeps the log-sum-exp per row.
//   backward: recomputes P from S and the log-sum-exp (flash attention's way: no T×T tensor is
//             kept between the passes), dP = dY·Vᵀ, dS = P∘(dP − rowsum(dY∘Y))·scale,
//             dQ = dS·K, dK += dSᵀ·Q, dV += Pᵀ·dY, written into [B, T, 3C].
// The products are BLAS sgemm calls on the tiles (looked up at run time, as runtime.cpp does
// OpenBLAS's thread setter); the element-wise passes are vectorised loops. Where the inputs are
// not float32 contiguous CPU tensors, or no BLAS is found, LibTorch's ops are used instead.
#pragma once

#include <torch/types.h>

namespace xloco::inner {

// y[B, T, C] = causal softmax(Q·Kᵀ/√hs)·V per head, for qkv[B, T, 3C] = [q | k | v] (nanoGPT's
// c_attn layout, heads contiguous within each third). Differentiable in qkv.
torch::Tensor causal_attention(const torch::Tensor& qkv, int64_t n_head);

// The same with LibTorch's ops (the reference the fused kernel is tested against, and the path
// for CUDA and other dtypes).
torch::Tensor causal_attention_aten(const torch::Tensor& qkv, int64_t n_head);

// Whether causal_attention() runs the fused kernel for this input (false: it falls back).
bool fused_attention_available(const torch::Tensor& qkv);

}  // namespace xloco::inner
