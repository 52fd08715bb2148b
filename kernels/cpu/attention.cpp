// Causal self-attention on matrix products: per (batch, query head), S =
// q k^T scaled (k and v of the key-value head the query head reads), a causal
// softmax, and probs @ v written straight into the head's columns of out; the
// backward pass runs the same products transposed, a thread per (batch,
// key-value head) taking the query heads of its group one after another, so
// that their gradients of the shared k and v add up without a race.
// Ring attention's blocks (context parallelism) run the same products on a
// block of queries against a block of keys, a row block of 64 queries at a
// time, so their scores take 64 x Tk floats of per-thread scratch (the
// probabilities are not kept: the backward pass rebuilds them from the rows'
// log-sum-exp).
//
// Formats. Scores, the softmax and its backward are fp32; the probabilities
// kept for the backward pass (`state`) and the score gradients of the
// backward's scratch are in the call's format, as an unfused 16-bit
// attention keeps them, and every product reads its operands in that format.
// Under fp32 the scores are computed in place in the state; under 16 bits a
// row block of them goes through per-thread fp32 scratch and is rounded once.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/vec_math.hpp"

namespace strata::kernels::cpu {
namespace {

using core::CPtr;
using core::from_float;
using core::Ptr;
using core::to_float;
using kernels::exp_vec;

// Rows of S are produced in blocks; block [r0, r1) only needs keys 0..r1-1,
// so the products skip most of the (all-zero) upper triangle: about half the
// FLOPs for long sequences, while the blocks stay big enough for sgemm.
constexpr int kRowBlock = 64;

// With at least one (b, h) pair per thread, each pair runs on one thread and
// its small products run single-threaded in OpenBLAS; otherwise the pairs run
// one after another and OpenBLAS uses the threads.
bool parallel_over_heads(int B, int NH) { return B * NH >= omp_get_max_threads(); }

// Per-thread scratch of fp32 (or of a 16-bit E's) rows, grown to the
// largest block seen.
template <typename X>
X* scratch_of(std::size_t n) {
  thread_local std::vector<X> s;
  if (s.size() < n) s.resize(n);
  return s.data();
}
// The rows of a 16-bit E for fp32 ones rounded (none under fp32: in_format
// hands the fp32 rows back).
template <typename E>
E* rounded_scratch(std::size_t n) {
  if constexpr (std::is_same_v<E, float>)
    return nullptr;
  else
    return scratch_of<E>(n);
}

// n fp32 values as E: the values themselves under fp32, else rounded into tmp.
template <typename E>
const E* in_format(float* x, E* tmp, std::int64_t n) {
  if constexpr (std::is_same_v<E, float>) {
    return x;
  } else {
    for (std::int64_t i = 0; i < n; ++i) tmp[i] = from_float<E>(x[i]);
    return tmp;
  }
}

// A causal softmax over row t's keys 0..t of s (fp32, in place); the row's
// entries above the diagonal are zeroed.
void softmax_row(float* row, int t, int T) {
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

// Its backward over row t (fp32, in place): dr, the probabilities'
// gradient, becomes the scores', p (dr - sum_j dr_j p_j) on keys 0..t and 0
// above the diagonal; p is the forward's row.
template <typename E>
void softmax_row_backward(float* dr, const E* p, int t, int T) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int j = 0; j <= t; ++j) dot += dr[j] * to_float(p[j]);
#pragma omp simd
  for (int j = 0; j <= t; ++j) dr[j] = to_float(p[j]) * (dr[j] - dot);
  for (int j = t + 1; j < T; ++j) dr[j] = 0.0f;
}

template <typename E>
void attention_forward_(E* out, E* probs, const E* qkv, int B, int T, int C, int NH, int NKV) {
  constexpr bool kWide = std::is_same_v<E, float>;
  const int hs = C / NH, KVC = NKV * hs, group = NH / NKV;
  const int C3 = C + 2 * KVC;  // a qkv row
  const float scale = 1.0f / std::sqrt(float(hs));
#pragma omp parallel for collapse(2) schedule(static) if (parallel_over_heads(B, NH))
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const E* row = qkv + std::int64_t(b) * T * C3;
      const E* q = row + h * hs;
      const E* k = row + C + (h / group) * hs;
      const E* v = k + KVC;
      E* att = probs + (std::int64_t(b) * NH + h) * T * T;
      E* y = out + std::int64_t(b) * T * C + h * hs;
      for (int r0 = 0; r0 < T; r0 += kRowBlock) {
        const int r1 = (r0 + kRowBlock < T) ? r0 + kRowBlock : T;
        E* p = att + std::int64_t(r0) * T;
        float* s = kWide ? reinterpret_cast<float*>(p) : scratch_of<float>(std::size_t(kRowBlock) * T);
        matmul(false, true, r1 - r0, r1, hs, scale, q + std::int64_t(r0) * C3, C3, k, C3, 0.0f, s, T);
        for (int t = r0; t < r1; ++t) softmax_row(s + std::int64_t(t - r0) * T, t, T);
        in_format(s, p, std::int64_t(r1 - r0) * T);  // under fp32, s is p
        matmul(false, false, r1 - r0, hs, r1, 1.0f, p, T, v, C3, 0.0f, y + std::int64_t(r0) * C, C);
      }
    }
  }
}

template <typename E>
void attention_backward_(E* dqkv, E* dprobs_scratch, const E* dout, const E* qkv, const E* probs, int B, int T, int C,
                         int NH, int NKV) {
  constexpr bool kWide = std::is_same_v<E, float>;
  const int hs = C / NH, KVC = NKV * hs, group = NH / NKV;
  const int C3 = C + 2 * KVC;
  const float scale = 1.0f / std::sqrt(float(hs));
  // Each (b, g) writes only its own query heads' columns of dq and its
  // key-value head's of dk and dv, so the pairs need no synchronisation.
#pragma omp parallel for collapse(2) schedule(static) if (parallel_over_heads(B, NKV))
  for (int b = 0; b < B; ++b) {
    for (int g = 0; g < NKV; ++g) {
      for (int h = g * group; h < (g + 1) * group; ++h) {
        const E* row = qkv + std::int64_t(b) * T * C3;
        const E* q = row + h * hs;
        const E* k = row + C + g * hs;
        const E* v = k + KVC;
        E* drow = dqkv + std::int64_t(b) * T * C3;
        E* dq = drow + h * hs;
        E* dk = drow + C + g * hs;
        E* dv = dk + KVC;
        const E* att = probs + (std::int64_t(b) * NH + h) * T * T;
        E* datt = dprobs_scratch + (std::int64_t(b) * NH + h) * T * T;
        const E* dy = dout + std::int64_t(b) * T * C + h * hs;

        for (int r0 = 0; r0 < T; r0 += kRowBlock) {
          const int r1 = (r0 + kRowBlock < T) ? r0 + kRowBlock : T;
          // dP = dout v^T, then (the rows are whole) dS = P * (dP - sum_j dP_j
          // P_j), zero above the diagonal, in fp32.
          E* ds = datt + std::int64_t(r0) * T;
          float* d = kWide ? reinterpret_cast<float*>(ds) : scratch_of<float>(std::size_t(kRowBlock) * T);
          matmul(false, true, r1 - r0, r1, hs, 1.0f, dy + std::int64_t(r0) * C, C, v, C3, 0.0f, d, T);
          for (int t = r0; t < r1; ++t) softmax_row_backward(d + std::int64_t(t - r0) * T, att + std::int64_t(t) * T, t, T);
          in_format(d, ds, std::int64_t(r1 - r0) * T);  // under fp32, d is ds
          // dv += P^T dout
          matmul(true, false, r1, hs, r1 - r0, 1.0f, att + std::int64_t(r0) * T, T, dy + std::int64_t(r0) * C, C, 1.0f,
                 dv, C3);
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

// Keys of the block query i may attend: 0 .. visible - 1 (causal on global positions).
int visible_keys(int i, int Tk, int q0, int k0) { return std::clamp(q0 + i - k0 + 1, 0, Tk); }

template <typename E>
void block_forward_(E* out, float* lse, const E* q, const E* kv, int B, int Tq, int Tk, int C, int NH, int NKV,
                    std::int64_t q_batch, std::int64_t kv_batch, int q0, int k0, bool accumulate) {
  const int hs = C / NH, KVC = NKV * hs, group = NH / NKV;
  const std::int64_t C3 = std::int64_t(C) + 2 * KVC, C2 = 2 * std::int64_t(KVC);
  const float scale = 1.0f / std::sqrt(float(hs));
  const float ninf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for collapse(2) schedule(static) if (parallel_over_heads(B, NH))
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const E* qh = q + std::int64_t(b) * q_batch * C3 + h * hs;
      const E* k = kv + std::int64_t(b) * kv_batch * C2 + (h / group) * hs;
      const E* v = k + KVC;
      E* y = out + std::int64_t(b) * q_batch * C + h * hs;
      float* l = lse + (std::int64_t(b) * NH + h) * q_batch;
      float* att = scratch_of<float>(std::size_t(kRowBlock) * (std::size_t(Tk) + hs + 1));  // [rows, nk]: scores, then P
      float* ob = att + std::int64_t(kRowBlock) * Tk;    // [rows, hs]: the block's attention
      float* lb = ob + std::int64_t(kRowBlock) * hs;     // [rows]: the block's log-sum-exp
      E* pe = rounded_scratch<E>(std::size_t(kRowBlock) * Tk);  // P in the call's format (16-bit)
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
          matmul(false, false, rows, hs, nk, 1.0f, in_format(att, pe, std::int64_t(rows) * nk), nk, v, int(C2), 0.0f,
                 ob, hs);
        } else {
          for (int i = 0; i < rows; ++i) lb[i] = ninf;
        }
        for (int i = 0; i < rows; ++i) {
          E* yr = y + std::int64_t(r0 + i) * C;
          const float* o = ob + std::int64_t(i) * hs;
          float& li = l[r0 + i];
          if (!accumulate || li == ninf) {
            // The first block a row meets (or the first it may attend).
            for (int d = 0; d < hs; ++d) yr[d] = from_float<E>(lb[i] == ninf ? 0.0f : o[d]);
            li = lb[i];
          } else if (lb[i] != ninf) {
            // The running log-sum-exp merge.
            const float mx = std::max(li, lb[i]);
            const float merged = mx + std::log(std::exp(li - mx) + std::exp(lb[i] - mx));
            const float a = std::exp(li - merged), c = std::exp(lb[i] - merged);
            for (int d = 0; d < hs; ++d) yr[d] = from_float<E>(to_float(yr[d]) * a + o[d] * c);
            li = merged;
          }
        }
      }
    }
  }
}

// DQ, DKV: E or float (accumulators).
template <typename E, typename DQ, typename DKV>
void block_backward_(DQ* dq, DKV* dkv, const E* dout, const E* q, const E* kv, const E* out, const float* lse, int B,
                     int Tq, int Tk, int C, int NH, int NKV, std::int64_t q_batch, std::int64_t kv_batch, int q0,
                     int k0) {
  const int hs = C / NH, KVC = NKV * hs, group = NH / NKV;
  const std::int64_t C3 = std::int64_t(C) + 2 * KVC, C2 = 2 * std::int64_t(KVC);
  const float scale = 1.0f / std::sqrt(float(hs));
  // Each (b, g) writes only its query heads' columns of dq and its
  // key-value head's of dk and dv.
#pragma omp parallel for collapse(2) schedule(static) if (parallel_over_heads(B, NKV))
  for (int b = 0; b < B; ++b) {
    for (int g = 0; g < NKV; ++g) {
      for (int h = g * group; h < (g + 1) * group; ++h) {
        const E* qh = q + std::int64_t(b) * q_batch * C3 + h * hs;
        const E* k = kv + std::int64_t(b) * kv_batch * C2 + g * hs;
        const E* v = k + KVC;
        DQ* dqh = dq + std::int64_t(b) * q_batch * C3 + h * hs;
        DKV* dk = dkv + std::int64_t(b) * kv_batch * C2 + g * hs;
        DKV* dv = dk + KVC;
        const E* y = out + std::int64_t(b) * q_batch * C + h * hs;
        const E* dy = dout + std::int64_t(b) * q_batch * C + h * hs;
        const float* l = lse + (std::int64_t(b) * NH + h) * q_batch;
        float* p = scratch_of<float>(std::size_t(kRowBlock) * 2 * std::size_t(Tk));  // [rows, nk]: P from the lse
        float* dp = p + std::int64_t(kRowBlock) * Tk;                              // [rows, nk]: dP, then dS
        E* pe = rounded_scratch<E>(std::size_t(kRowBlock) * 2 * std::size_t(Tk));  // P and dS in the call's format
        E* dse = pe == nullptr ? nullptr : pe + std::int64_t(kRowBlock) * Tk;
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
            for (int d = 0; d < hs; ++d)
              D += to_float(dy[std::int64_t(r0 + i) * C + d]) * to_float(y[std::int64_t(r0 + i) * C + d]);
            const float li = l[r0 + i];
            for (int j = 0; j < n; ++j) {
              pr[j] = exp_vec(pr[j] - li);
              dr[j] = pr[j] * (dr[j] - D);
            }
            for (int j = n; j < nk; ++j) pr[j] = dr[j] = 0.0f;
          }
          const E* pk = in_format(p, pe, std::int64_t(rows) * nk);
          const E* ds = in_format(dp, dse, std::int64_t(rows) * nk);
          // dv += P^T dout; dq += scale dS k; dk += scale dS^T q.
          matmul(true, false, nk, hs, rows, 1.0f, pk, nk, dy + std::int64_t(r0) * C, C, 1.0f, dv, int(C2));
          matmul(false, false, rows, hs, nk, scale, ds, nk, k, int(C2), 1.0f, dqh + std::int64_t(r0) * C3, int(C3));
          matmul(true, false, nk, hs, rows, scale, ds, nk, qh + std::int64_t(r0) * C3, int(C3), 1.0f, dk, int(C2));
        }
      }
    }
  }
}

}  // namespace

void attention_forward(Ptr out, Ptr probs, CPtr qkv, int B, int T, int C, int NH, int NKV) {
  STRATA_BY_FORMAT(out, attention_forward_(out.as<E>(), probs.as<E>(), qkv.as<E>(), B, T, C, NH, NKV));
}

void attention_backward(Ptr dqkv, Ptr scratch, CPtr dout, CPtr qkv, CPtr /*out*/, CPtr probs, int B, int T, int C,
                        int NH, int NKV) {
  STRATA_BY_FORMAT(dqkv, attention_backward_(dqkv.as<E>(), scratch.as<E>(), dout.as<E>(), qkv.as<E>(), probs.as<E>(),
                                             B, T, C, NH, NKV));
}

namespace {

// Row by row in fp32: each 16-bit entry widened as it is read, rounded once
// as it is written.
template <typename E>
void causal_softmax_forward_(E* p, std::int64_t count, int T) {
  const std::int64_t rows = count * T;
#pragma omp parallel for schedule(static) if (rows * T >= (1 << 16))
  for (std::int64_t r = 0; r < rows; ++r) {
    E* x = p + r * T;
    const int t = int(r % T);
    float* row = scratch_of<float>(std::size_t(T));
    for (int j = 0; j <= t; ++j) row[j] = to_float(x[j]);
    softmax_row(row, t, T);
    for (int j = 0; j < T; ++j) x[j] = from_float<E>(row[j]);
  }
}

template <typename E>
void causal_softmax_backward_(E* dp, const E* p, std::int64_t count, int T) {
  const std::int64_t rows = count * T;
#pragma omp parallel for schedule(static) if (rows * T >= (1 << 16))
  for (std::int64_t r = 0; r < rows; ++r) {
    E* d = dp + r * T;
    const int t = int(r % T);
    float* row = scratch_of<float>(std::size_t(T));
    for (int j = 0; j <= t; ++j) row[j] = to_float(d[j]);
    softmax_row_backward(row, p + r * T, t, T);
    for (int j = 0; j < T; ++j) d[j] = from_float<E>(row[j]);
  }
}

}  // namespace

void causal_softmax_forward(Ptr p, std::int64_t count, int T) {
  STRATA_BY_FORMAT(p, causal_softmax_forward_(p.as<E>(), count, T));
}

void causal_softmax_backward(Ptr dp, CPtr p, std::int64_t count, int T) {
  STRATA_BY_FORMAT(dp, causal_softmax_backward_(dp.as<E>(), p.as<E>(), count, T));
}

void attention_block_forward(Ptr out, float* lse, CPtr q, CPtr kv, int B, int Tq, int Tk, int C, int NH, int NKV,
                             std::int64_t q_batch, std::int64_t kv_batch, int q0, int k0, bool accumulate) {
  STRATA_BY_FORMAT(out, block_forward_(out.as<E>(), lse, q.as<E>(), kv.as<E>(), B, Tq, Tk, C, NH, NKV, q_batch,
                                       kv_batch, q0, k0, accumulate));
}

void attention_block_backward(Ptr dq, Ptr dkv, CPtr dout, CPtr q, CPtr kv, CPtr out, const float* lse, int B, int Tq,
                              int Tk, int C, int NH, int NKV, std::int64_t q_batch, std::int64_t kv_batch, int q0,
                              int k0) {
  STRATA_BY_FORMAT(q, core::with_accumulator<E>(dq.precision(), [&](auto qt) {
    core::with_accumulator<E>(dkv.precision(), [&](auto kt) {
      block_backward_(dq.as<decltype(qt)>(), dkv.as<decltype(kt)>(), dout.as<E>(), q.as<E>(), kv.as<E>(), out.as<E>(),
                      lse, B, Tq, Tk, C, NH, NKV, q_batch, kv_batch, q0, k0);
    });
  }));
}

}  // namespace strata::kernels::cpu
