// Causal multi-head self-attention on BLAS: per (batch, head), S = q k^T
// scaled, a causal softmax in place, and probs @ v written straight into the
// head's columns of out; the backward pass runs the same products transposed.
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace strata::kernels::cpu {
namespace {

using cpu::exp_vec;

// Rows of S are produced in blocks; block [r0, r1) only needs keys 0..r1-1,
// so the products skip most of the (all-zero) upper triangle: about half the
// FLOPs for long sequences, while the blocks stay big enough for sgemm.
constexpr int kRowBlock = 64;

// With at least one (b, h) pair per thread, each pair runs on one thread and
// its small products run single-threaded in OpenBLAS; otherwise the pairs run
// one after another and OpenBLAS uses the threads.
bool parallel_over_heads(int B, int NH) { return B * NH >= omp_get_max_threads(); }

}  // namespace

void attention_forward(float* out, float* probs, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
#pragma omp parallel for collapse(2) schedule(static) if (parallel_over_heads(B, NH))
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* q = qkv + std::int64_t(b) * T * C3 + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* att = probs + (std::int64_t(b) * NH + h) * T * T;
      float* y = out + std::int64_t(b) * T * C + h * hs;

      for (int r0 = 0; r0 < T; r0 += kRowBlock) {
        const int r1 = (r0 + kRowBlock < T) ? r0 + kRowBlock : T;
        matmul(false, true, r1 - r0, r1, hs, scale, q + std::int64_t(r0) * C3, C3, k, C3, 0.0f,
               att + std::int64_t(r0) * T, T);
      }
      for (int t = 0; t < T; ++t) {
        float* row = att + std::int64_t(t) * T;
        float m = row[0];
#pragma omp simd reduction(max : m)
        for (int j = 0; j <= t; ++j) m = row[j] > m ? row[j] : m;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j <= t; ++j) {
          row[j] = exp_vec(row[j] - m);
          sum += row[j];
        }
        const float inv = 1.0f / sum;
#pragma omp simd
        for (int j = 0; j <= t; ++j) row[j] *= inv;
        for (int j = t + 1; j < T; ++j) row[j] = 0.0f;
      }
      for (int r0 = 0; r0 < T; r0 += kRowBlock) {
        const int r1 = (r0 + kRowBlock < T) ? r0 + kRowBlock : T;
        matmul(false, false, r1 - r0, hs, r1, 1.0f, att + std::int64_t(r0) * T, T, v, C3, 0.0f,
               y + std::int64_t(r0) * C, C);
      }
    }
  }
}

void attention_backward(float* dqkv, float* dprobs_scratch, const float* dout, const float* qkv, const float* /*out*/, const float* probs,
                        int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
  // Each (b, h) writes only its own head's columns of dq, dk and dv, so the
  // pairs need no synchronisation.
#pragma omp parallel for collapse(2) schedule(static) if (parallel_over_heads(B, NH))
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* q = qkv + std::int64_t(b) * T * C3 + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + std::int64_t(b) * T * C3 + h * hs;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* att = probs + (std::int64_t(b) * NH + h) * T * T;
      float* datt = dprobs_scratch + (std::int64_t(b) * NH + h) * T * T;
      const float* dy = dout + std::int64_t(b) * T * C + h * hs;

      for (int r0 = 0; r0 < T; r0 += kRowBlock) {
        const int r1 = (r0 + kRowBlock < T) ? r0 + kRowBlock : T;
        // dP = dout v^T
        matmul(false, true, r1 - r0, r1, hs, 1.0f, dy + std::int64_t(r0) * C, C, v, C3, 0.0f,
               datt + std::int64_t(r0) * T, T);
        // dv += P^T dout
        matmul(true, false, r1, hs, r1 - r0, 1.0f, att + std::int64_t(r0) * T, T, dy + std::int64_t(r0) * C, C, 1.0f,
               dv, C3);
      }
      // Softmax backward: dS = P * (dP - sum_j dP_j P_j), zero above the diagonal.
      for (int t = 0; t < T; ++t) {
        const float* p = att + std::int64_t(t) * T;
        float* d = datt + std::int64_t(t) * T;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int j = 0; j <= t; ++j) dot += d[j] * p[j];
#pragma omp simd
        for (int j = 0; j <= t; ++j) d[j] = p[j] * (d[j] - dot);
        for (int j = t + 1; j < T; ++j) d[j] = 0.0f;
      }
      for (int r0 = 0; r0 < T; r0 += kRowBlock) {
        const int r1 = (r0 + kRowBlock < T) ? r0 + kRowBlock : T;
        // dq += scale dS k ; dk += scale dS^T q
        matmul(false, false, r1 - r0, hs, r1, scale, datt + std::int64_t(r0) * T, T, k, C3, 1.0f,
               dq + std::int64_t(r0) * C3, C3);
        matmul(true, false, r1, hs, r1 - r0, scale, datt + std::int64_t(r0) * T, T, q + std::int64_t(r0) * C3, C3, 1.0f,
               dk, C3);
      }
    }
  }
}

}  // namespace strata::kernels::cpu
