// Causal self-attention on BLAS: per (batch, query head), S = q k^T scaled
// (k and v of the key-value head the query head reads), a causal softmax in
// place, and probs @ v written straight into the head's columns of out; the
// backward pass runs the same products transposed, a thread per (batch,
// key-value head) taking the query heads of its group one after another, so
// that their gradients of the shared k and v add up without a race.
// Ring attention's blocks (context parallelism) run the same products on a
// block of queries against a block of keys, a row block of 64 queries at a
// time, so their scores take 64 x Tk floats of per-thread scratch (the
// probabilities are not kept: the backward pass rebuilds them from the rows'
// log-sum-exp).
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/vec_math.hpp"

namespace strata::kernels::cpu {
namespace {

using kernels::exp_vec;

// Rows of S are produced in blocks; block [r0, r1) only needs keys 0..r1-1,
// so the products skip most of the (all-zero) upper triangle: about half the
// FLOPs for long sequences, while the blocks stay big enough for sgemm.
constexpr int kRowBlock = 64;

// With at least one (b, h) pair per thread, each pair runs on one thread and
// its small products run single-threaded in OpenBLAS; otherwise the pairs run
// one after another and OpenBLAS uses the threads.
bool parallel_over_heads(int B, int NH) { return B * NH >= omp_get_max_threads(); }

}  // namespace

void attention_forward(float* out, float* probs, const float* qkv, int B, int T, int C, int NH, int NKV) {
  const int hs = C / NH, KVC = NKV * hs, group = NH / NKV;
  const int C3 = C + 2 * KVC;  // a qkv row
  const float scale = 1.0f / std::sqrt(float(hs));
#pragma omp parallel for collapse(2) schedule(static) if (parallel_over_heads(B, NH))
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* row = qkv + std::int64_t(b) * T * C3;
      const float* q = row + h * hs;
      const float* k = row + C + (h / group) * hs;
      const float* v = k + KVC;
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
                        int B, int T, int C, int NH, int NKV) {
  const int hs = C / NH, KVC = NKV * hs, group = NH / NKV;
  const int C3 = C + 2 * KVC;
  const float scale = 1.0f / std::sqrt(float(hs));
  // Each (b, g) writes only its own query heads' columns of dq and its
  // key-value head's of dk and dv, so the pairs need no synchronisation.
#pragma omp parallel for collapse(2) schedule(static) if (parallel_over_heads(B, NKV))
  for (int b = 0; b < B; ++b) {
    for (int g = 0; g < NKV; ++g) {
      for (int h = g * group; h < (g + 1) * group; ++h) {
        const float* row = qkv + std::int64_t(b) * T * C3;
        const float* q = row + h * hs;
        const float* k = row + C + g * hs;
        const float* v = k + KVC;
        float* drow = dqkv + std::int64_t(b) * T * C3;
        float* dq = drow + h * hs;
        float* dk = drow + C + g * hs;
        float* dv = dk + KVC;
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
          matmul(true, false, r1, hs, r1 - r0, scale, datt + std::int64_t(r0) * T, T, q + std::int64_t(r0) * C3, C3,
                 1.0f, dk, C3);
        }
      }
    }
  }
}

namespace {

// Keys of the block query i may attend: 0 .. visible - 1 (causal on global positions).
int visible_keys(int i, int Tk, int q0, int k0) { return std::clamp(q0 + i - k0 + 1, 0, Tk); }

// Per-thread scratch of the block kernels, grown to the largest block seen.
std::vector<float>& block_scratch(std::size_t n) {
  thread_local std::vector<float> s;
  if (s.size() < n) s.resize(n);
  return s;
}

}  // namespace

void attention_block_forward(float* out, float* lse, const float* q, const float* kv, int B, int Tq, int Tk, int C,
                             int NH, int NKV, std::int64_t q_batch, std::int64_t kv_batch, int q0, int k0,
                             bool accumulate) {
  const int hs = C / NH, KVC = NKV * hs, group = NH / NKV;
  const std::int64_t C3 = std::int64_t(C) + 2 * KVC, C2 = 2 * std::int64_t(KVC);
  const float scale = 1.0f / std::sqrt(float(hs));
  const float ninf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for collapse(2) schedule(static) if (parallel_over_heads(B, NH))
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* qh = q + std::int64_t(b) * q_batch * C3 + h * hs;
      const float* k = kv + std::int64_t(b) * kv_batch * C2 + (h / group) * hs;
      const float* v = k + KVC;
      float* y = out + std::int64_t(b) * q_batch * C + h * hs;
      float* l = lse + (std::int64_t(b) * NH + h) * q_batch;
      std::vector<float>& scratch = block_scratch(std::size_t(kRowBlock) * (std::size_t(Tk) + hs + 1));
      float* att = scratch.data();                       // [rows, nk]: scores, then probabilities
      float* ob = att + std::int64_t(kRowBlock) * Tk;    // [rows, hs]: the block's attention
      float* lb = ob + std::int64_t(kRowBlock) * hs;     // [rows]: the block's log-sum-exp
      for (int r0 = 0; r0 < Tq; r0 += kRowBlock) {
        const int rows = std::min(kRowBlock, Tq - r0);
        const int nk = visible_keys(r0 + rows - 1, Tk, q0, k0);  // what the block's last row sees: the most
        if (nk > 0) {
          matmul(false, true, rows, nk, hs, scale, qh + std::int64_t(r0) * C3, int(C3), k, int(C2), 0.0f, att, nk);
          for (int i = 0; i < rows; ++i) {
            float* row = att + std::int64_t(i) * nk;
            const int n = visible_keys(r0 + i, Tk, q0, k0);
            lb[i] = ninf;
            if (n > 0) {
              float m = row[0];
              for (int j = 1; j < n; ++j) m = row[j] > m ? row[j] : m;
              float sum = 0.0f;
              for (int j = 0; j < n; ++j) {
                row[j] = exp_vec(row[j] - m);
                sum += row[j];
              }
              const float inv = 1.0f / sum;
              for (int j = 0; j < n; ++j) row[j] *= inv;
              lb[i] = m + std::log(sum);
            }
            for (int j = n; j < nk; ++j) row[j] = 0.0f;
          }
          matmul(false, false, rows, hs, nk, 1.0f, att, nk, v, int(C2), 0.0f, ob, hs);
        } else {
          for (int i = 0; i < rows; ++i) lb[i] = ninf;
        }
        for (int i = 0; i < rows; ++i) {
          float* yr = y + std::int64_t(r0 + i) * C;
          const float* o = ob + std::int64_t(i) * hs;
          float& li = l[r0 + i];
          if (!accumulate || li == ninf) {
            // The first block a row meets (or the first it may attend).
            for (int d = 0; d < hs; ++d) yr[d] = lb[i] == ninf ? 0.0f : o[d];
            li = lb[i];
          } else if (lb[i] != ninf) {
            // The running log-sum-exp merge.
            const float mx = std::max(li, lb[i]);
            const float merged = mx + std::log(std::exp(li - mx) + std::exp(lb[i] - mx));
            const float a = std::exp(li - merged), c = std::exp(lb[i] - merged);
            for (int d = 0; d < hs; ++d) yr[d] = yr[d] * a + o[d] * c;
            li = merged;
          }
        }
      }
    }
  }
}

void attention_block_backward(float* dq, float* dkv, const float* dout, const float* q, const float* kv,
                              const float* out, const float* lse, int B, int Tq, int Tk, int C, int NH, int NKV,
                              std::int64_t q_batch, std::int64_t kv_batch, int q0, int k0) {
  const int hs = C / NH, KVC = NKV * hs, group = NH / NKV;
  const std::int64_t C3 = std::int64_t(C) + 2 * KVC, C2 = 2 * std::int64_t(KVC);
  const float scale = 1.0f / std::sqrt(float(hs));
  // Each (b, g) writes only its query heads' columns of dq and its
  // key-value head's of dk and dv.
#pragma omp parallel for collapse(2) schedule(static) if (parallel_over_heads(B, NKV))
  for (int b = 0; b < B; ++b) {
    for (int g = 0; g < NKV; ++g) {
      for (int h = g * group; h < (g + 1) * group; ++h) {
        const float* qh = q + std::int64_t(b) * q_batch * C3 + h * hs;
        const float* k = kv + std::int64_t(b) * kv_batch * C2 + g * hs;
        const float* v = k + KVC;
        float* dqh = dq + std::int64_t(b) * q_batch * C3 + h * hs;
        float* dk = dkv + std::int64_t(b) * kv_batch * C2 + g * hs;
        float* dv = dk + KVC;
        const float* y = out + std::int64_t(b) * q_batch * C + h * hs;
        const float* dy = dout + std::int64_t(b) * q_batch * C + h * hs;
        const float* l = lse + (std::int64_t(b) * NH + h) * q_batch;
        std::vector<float>& scratch = block_scratch(std::size_t(kRowBlock) * 2 * std::size_t(Tk));
        float* p = scratch.data();                        // [rows, nk]: P, rebuilt from the rows' log-sum-exp
        float* dp = p + std::int64_t(kRowBlock) * Tk;     // [rows, nk]: dP, then dS
        for (int r0 = 0; r0 < Tq; r0 += kRowBlock) {
          const int rows = std::min(kRowBlock, Tq - r0);
          const int nk = visible_keys(r0 + rows - 1, Tk, q0, k0);
          if (nk == 0) continue;
          matmul(false, true, rows, nk, hs, scale, qh + std::int64_t(r0) * C3, int(C3), k, int(C2), 0.0f, p, nk);
          matmul(false, true, rows, nk, hs, 1.0f, dy + std::int64_t(r0) * C, C, v, int(C2), 0.0f, dp, nk);
          for (int i = 0; i < rows; ++i) {
            float* pr = p + std::int64_t(i) * nk;
            float* dr = dp + std::int64_t(i) * nk;
            const int n = visible_keys(r0 + i, Tk, q0, k0);
            // D_i = dout_i . out_i: the softmax backward's row term over every
            // key of every block, which out (the final one) carries.
            float D = 0.0f;
            for (int d = 0; d < hs; ++d) D += dy[std::int64_t(r0 + i) * C + d] * y[std::int64_t(r0 + i) * C + d];
            const float li = l[r0 + i];
            for (int j = 0; j < n; ++j) {
              pr[j] = exp_vec(pr[j] - li);
              dr[j] = pr[j] * (dr[j] - D);
            }
            for (int j = n; j < nk; ++j) pr[j] = dr[j] = 0.0f;
          }
          // dv += P^T dout; dq += scale dS k; dk += scale dS^T q.
          matmul(true, false, nk, hs, rows, 1.0f, p, nk, dy + std::int64_t(r0) * C, C, 1.0f, dv, int(C2));
          matmul(false, false, rows, hs, nk, scale, dp, nk, k, int(C2), 1.0f, dqh + std::int64_t(r0) * C3, int(C3));
          matmul(true, false, nk, hs, rows, scale, dp, nk, qh + std::int64_t(r0) * C3, int(C3), 1.0f, dk, int(C2));
        }
      }
    }
  }
}

}  // namespace strata::kernels::cpu
