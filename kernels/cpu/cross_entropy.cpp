// Fused softmax + cross-entropy over the vocabulary. The logits are the
// largest activation of a GPT (N x V with V ~ 50k), so the forward reads
// them twice and the backward overwrites them in place with their gradient.
// Logits and their gradient are in the call's format; every row figure
// (maximum, sum of exponentials, loss) is fp32 or double.
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/vec_math.hpp"

namespace strata::kernels::cpu {
namespace {

using core::CPtr;
using core::from_float;
using core::Ptr;
using core::to_float;
using kernels::exp_vec;

template <typename E>
float max_of(const E* x, int V) {
  float m = to_float(x[0]);
#pragma omp simd reduction(max : m)
  for (int i = 0; i < V; ++i) m = to_float(x[i]) > m ? to_float(x[i]) : m;
  return m;
}

// sum_i exp(x[i] - m) in double. Float partial sums over blocks of 128 (16
// terms per vector lane: relative error below 1e-6) are added up in double: a
// float sum of 50k terms would drift, while one long double-precision
// accumulation chain cost a quarter of the kernel's time. With kStore, each
// exp(x[i] - m) is also stored in e[i] (fp32 rows: e may be x).
template <bool kStore = false, typename E>
double exp_sum(const E* x, float m, int V, float* e = nullptr) {
  constexpr int kBlock = 128;
  double sum = 0.0;
  for (int i0 = 0; i0 < V; i0 += kBlock) {
    const int i1 = (i0 + kBlock < V) ? i0 + kBlock : V;
    float part = 0.0f;
#pragma omp simd reduction(+ : part)
    for (int i = i0; i < i1; ++i) {
      const float ei = exp_vec(to_float(x[i]) - m);
      if constexpr (kStore) e[i] = ei;
      part += ei;
    }
    sum += part;
  }
  return sum;
}

template <typename E>
void forward_(float* losses, const E* logits, const std::int32_t* targets, int N, int V) {
#pragma omp parallel for schedule(static) if (std::int64_t(N) * V >= (1 << 15))
  for (int n = 0; n < N; ++n) {
    const E* x = logits + std::int64_t(n) * V;
    const float m = max_of(x, V);
    const double sum = exp_sum(x, m, V);
    losses[n] = float(double(m) + std::log(sum) - double(to_float(x[targets[n]])));
  }
}

// dx = (exp(x - m) * scale - [i == t] dloss), rounded once; dx may be x:
// element i is read before it is written. t < 0: no target in the row.
template <typename E>
void softmax_row_gradient(E* dx, const E* x, float m, float scale, int t, float dloss, int V) {
#pragma omp simd
  for (int i = 0; i < V; ++i) {
    const float g = exp_vec(to_float(x[i]) - m) * scale;
    dx[i] = from_float<E>(i == t ? g - dloss : g);
  }
}

template <typename E>
void backward_(E* dlogits, const E* logits, const std::int32_t* targets, float dloss, int N, int V) {
  // The row maximum and sum are known before the first write.
#pragma omp parallel for schedule(static) if (std::int64_t(N) * V >= (1 << 15))
  for (int n = 0; n < N; ++n) {
    const E* x = logits + std::int64_t(n) * V;
    const float m = max_of(x, V);
    if constexpr (std::is_same_v<E, float>) {
      // fp32: the exponentials stored as they are summed, then scaled (one
      // exp a logit). A 16-bit row is computed again from x instead, so that
      // its gradient is rounded once.
      float* dx = dlogits + std::int64_t(n) * V;
      const float scale = float(double(dloss) / exp_sum<true>(x, m, V, dx));
#pragma omp simd
      for (int i = 0; i < V; ++i) dx[i] *= scale;
      dx[targets[n]] -= dloss;
    } else {
      const float scale = float(double(dloss) / exp_sum(x, m, V));
      softmax_row_gradient(dlogits + std::int64_t(n) * V, x, m, scale, targets[n], dloss, V);
    }
  }
}

template <typename E>
void row_max_(float* m, const E* logits, int N, int V) {
  for (int n = 0; n < N; ++n) m[n] = max_of(logits + std::int64_t(n) * V, V);
}

template <typename E>
void row_exp_sum_(float* s, const E* logits, const float* m, int N, int V) {
#pragma omp parallel for schedule(static) if (std::int64_t(N) * V >= (1 << 15))
  for (int n = 0; n < N; ++n) s[n] = float(exp_sum(logits + std::int64_t(n) * V, m[n], V));
}

template <typename E>
void pick_target_logits_(float* x, const E* logits, const std::int32_t* targets, int v_begin, int N, int V) {
  for (int n = 0; n < N; ++n) {
    const int t = targets[n] - v_begin;
    x[n] = (t >= 0 && t < V) ? to_float(logits[std::int64_t(n) * V + t]) : 0.0f;
  }
}

template <typename E>
void backward_sharded_(E* dlogits, const E* logits, const float* m, const float* s, const std::int32_t* targets,
                       int v_begin, float dloss, int N, int V) {
#pragma omp parallel for schedule(static) if (std::int64_t(N) * V >= (1 << 15))
  for (int n = 0; n < N; ++n) {
    const int t = targets[n] - v_begin;
    softmax_row_gradient(dlogits + std::int64_t(n) * V, logits + std::int64_t(n) * V, m[n],
                         float(double(dloss) / double(s[n])), t >= 0 && t < V ? t : -1, dloss, V);
  }
}

}  // namespace

void softmax_cross_entropy_forward(float* losses, CPtr logits, const std::int32_t* targets, int N, int V) {
  STRATA_BY_FORMAT(logits, forward_(losses, logits.as<E>(), targets, N, V));
}

void softmax_cross_entropy_backward(Ptr dlogits, CPtr logits, const std::int32_t* targets, float dloss, int N, int V) {
  STRATA_BY_FORMAT(dlogits, backward_(dlogits.as<E>(), logits.as<E>(), targets, dloss, N, V));
}

// The vocabulary-parallel pieces: the same passes as the fused kernels, with
// the row statistics coming from outside (combined over the tensor-parallel
// ranks) instead of from the local row.
void row_max(float* m, CPtr logits, int N, int V) { STRATA_BY_FORMAT(logits, row_max_(m, logits.as<E>(), N, V)); }

void row_exp_sum(float* s, CPtr logits, const float* m, int N, int V) {
  STRATA_BY_FORMAT(logits, row_exp_sum_(s, logits.as<E>(), m, N, V));
}

void pick_target_logits(float* x, CPtr logits, const std::int32_t* targets, int v_begin, int N, int V) {
  STRATA_BY_FORMAT(logits, pick_target_logits_(x, logits.as<E>(), targets, v_begin, N, V));
}

void cross_entropy_from_parts(float* losses, const float* m, const float* s, const float* x, int N) {
  for (int n = 0; n < N; ++n) losses[n] = float(double(m[n]) + std::log(double(s[n])) - double(x[n]));
}

void softmax_cross_entropy_backward_sharded(Ptr dlogits, CPtr logits, const float* m, const float* s,
                                            const std::int32_t* targets, int v_begin, float dloss, int N, int V) {
  STRATA_BY_FORMAT(dlogits, backward_sharded_(dlogits.as<E>(), logits.as<E>(), m, s, targets, v_begin, dloss, N, V));
}

}  // namespace strata::kernels::cpu
