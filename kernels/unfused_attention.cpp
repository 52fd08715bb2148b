#include "kernels/unfused_attention.hpp"

#include <cmath>
#include <cstdint>

#include "kernels/kernels.hpp"

namespace strata::kernels {

namespace {

// Where head h's tensors start in sequence b, and the strides between the
// heads of one product batch: query heads j, j + g, j + 2g, ... (g = NH /
// NKV query heads per key-value head), one per key-value head.
struct Heads {
  int T, C, hs, kvc, g, W;  // W: a qkv row
  Heads(int T_, int C_, int NH, int NKV)
      : T(T_), C(C_), hs(C_ / NH), kvc(NKV * (C_ / NH)), g(NH / NKV), W(C_ + 2 * NKV * (C_ / NH)) {}
  std::int64_t row(int b) const { return std::int64_t(b) * T * W; }                // qkv and dqkv
  std::int64_t q(int b, int j) const { return row(b) + std::int64_t(j) * hs; }     // stride g hs
  std::int64_t k(int b) const { return row(b) + C; }                              // stride hs
  std::int64_t v(int b) const { return row(b) + C + kvc; }                        // stride hs
  std::int64_t o(int b, int j) const { return std::int64_t(b) * T * C + std::int64_t(j) * hs; }  // stride g hs
  std::int64_t square(int b, int NH, int j) const { return (std::int64_t(b) * NH + j) * T * T; }   // stride g T T
};

}  // namespace

void unfused_attention_forward(core::Ptr out, core::Ptr probs, core::CPtr qkv, int B, int T, int C, int NH, int NKV) {
  const Heads h(T, C, NH, NKV);
  const float scale = 1.0f / std::sqrt(float(h.hs));
  const std::int64_t sq = std::int64_t(h.g) * T * T, qs = std::int64_t(h.g) * h.hs;
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < h.g; ++j)  // S = scale q k^T
      matmul_strided_batched(false, true, T, T, h.hs, scale, qkv + h.q(b, j), h.W, qs, qkv + h.k(b), h.W, h.hs, 0.0f,
                             probs + h.square(b, NH, j), T, sq, NKV);
  causal_softmax_forward(probs, std::int64_t(B) * NH, T);
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < h.g; ++j)  // out = P v
      matmul_strided_batched(false, false, T, h.hs, T, 1.0f, probs + h.square(b, NH, j), T, sq, qkv + h.v(b), h.W,
                             h.hs, 0.0f, out + h.o(b, j), C, qs, NKV);
}

void unfused_attention_backward(core::Ptr dqkv, core::Ptr dprobs, core::CPtr dout, core::CPtr qkv, core::CPtr probs,
                                int B, int T, int C, int NH, int NKV) {
  const Heads h(T, C, NH, NKV);
  const float scale = 1.0f / std::sqrt(float(h.hs));
  const std::int64_t sq = std::int64_t(h.g) * T * T, qs = std::int64_t(h.g) * h.hs;
  // The query heads of a key-value head add into its dk and dv one after
  // another (j), never in one batch.
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < h.g; ++j) {
      // dP = dout v^T; dv += P^T dout
      matmul_strided_batched(false, true, T, T, h.hs, 1.0f, dout + h.o(b, j), C, qs, qkv + h.v(b), h.W, h.hs, 0.0f,
                             dprobs + h.square(b, NH, j), T, sq, NKV);
      matmul_strided_batched(true, false, T, h.hs, T, 1.0f, probs + h.square(b, NH, j), T, sq, dout + h.o(b, j), C,
                             qs, 1.0f, dqkv + h.v(b), h.W, h.hs, NKV);
    }
  causal_softmax_backward(dprobs, probs, std::int64_t(B) * NH, T);  // dS in dP's place
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < h.g; ++j) {
      // dq += scale dS k; dk += scale dS^T q
      matmul_strided_batched(false, false, T, h.hs, T, scale, dprobs + h.square(b, NH, j), T, sq, qkv + h.k(b), h.W,
                             h.hs, 1.0f, dqkv + h.q(b, j), h.W, qs, NKV);
      matmul_strided_batched(true, false, T, h.hs, T, scale, dprobs + h.square(b, NH, j), T, sq, qkv + h.q(b, j), h.W,
                             qs, 1.0f, dqkv + h.k(b), h.W, h.hs, NKV);
    }
}

}  // namespace strata::kernels
