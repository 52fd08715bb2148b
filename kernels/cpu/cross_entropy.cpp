// Fused softmax + cross-entropy over the vocabulary. The logits are the
// largest activation of a GPT (N x V with V ~ 50k), so the forward reads
// them twice and the backward overwrites them in place with their gradient.
#include <bit>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/vec_math.hpp"

namespace strata::kernels::cpu {
namespace {

using kernels::exp_vec;

float max_of(const float* x, int V) {
  float m = x[0];
#pragma omp simd reduction(max : m)
  for (int i = 0; i < V; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// sum_i exp(x[i] - m); with kStore, each exponential is also written to e
// (which may be x). Float partial sums over blocks of 128 (16 terms per vector
// lane: relative error below 1e-6) are added up in double: a float sum of 50k
// terms would drift, while one long double-precision accumulation chain cost
// a quarter of the kernel's time.
template <bool kStore>
double exp_sum(const float* x, float m, int V, float* e) {
  constexpr int kBlock = 128;
  double sum = 0.0;
  for (int i0 = 0; i0 < V; i0 += kBlock) {
    const int i1 = (i0 + kBlock < V) ? i0 + kBlock : V;
    float part = 0.0f;
#pragma omp simd reduction(+ : part)
    for (int i = i0; i < i1; ++i) {
      const float ei = exp_vec(x[i] - m);
      if constexpr (kStore) e[i] = ei;
      part += ei;
    }
    sum += part;
  }
  return sum;
}

}  // namespace

void softmax_cross_entropy_forward(float* losses, const float* logits, const std::int32_t* targets, int N, int V) {
#pragma omp parallel for schedule(static) if (std::int64_t(N) * V >= (1 << 15))
  for (int n = 0; n < N; ++n) {
    const float* x = logits + std::int64_t(n) * V;
    const float m = max_of(x, V);
    const double sum = exp_sum<false>(x, m, V, nullptr);
    losses[n] = float(double(m) + std::log(sum) - double(x[targets[n]]));
  }
}

void softmax_cross_entropy_backward(float* dlogits, const float* logits, const std::int32_t* targets, float dloss,
                                    int N, int V) {
  // dlogits may be logits: every pass reads element i before writing it, and
  // the first write happens only after the row maximum is known.
#pragma omp parallel for schedule(static) if (std::int64_t(N) * V >= (1 << 15))
  for (int n = 0; n < N; ++n) {
    const float* x = logits + std::int64_t(n) * V;
    float* dx = dlogits + std::int64_t(n) * V;
    const float m = max_of(x, V);
    const double sum = exp_sum<true>(x, m, V, dx);
    const float scale = float(double(dloss) / sum);
#pragma omp simd
    for (int i = 0; i < V; ++i) dx[i] *= scale;
    dx[targets[n]] -= dloss;
  }
}

// The vocabulary-parallel pieces: the same passes as the fused kernels, with
// the row statistics coming from outside (combined over the tensor-parallel
// ranks) instead of from the local row.
void row_max(float* m, const float* logits, int N, int V) {
  for (int n = 0; n < N; ++n) m[n] = max_of(logits + std::int64_t(n) * V, V);
}

void row_exp_sum(float* s, const float* logits, const float* m, int N, int V) {
#pragma omp parallel for schedule(static) if (std::int64_t(N) * V >= (1 << 15))
  for (int n = 0; n < N; ++n) s[n] = float(exp_sum<false>(logits + std::int64_t(n) * V, m[n], V, nullptr));
}

void pick_target_logits(float* x, const float* logits, const std::int32_t* targets, int v_begin, int N, int V) {
  for (int n = 0; n < N; ++n) {
    const int t = targets[n] - v_begin;
    x[n] = (t >= 0 && t < V) ? logits[std::int64_t(n) * V + t] : 0.0f;
  }
}

void cross_entropy_from_parts(float* losses, const float* m, const float* s, const float* x, int N) {
  for (int n = 0; n < N; ++n) losses[n] = float(double(m[n]) + std::log(double(s[n])) - double(x[n]));
}

void softmax_cross_entropy_backward_sharded(float* dlogits, const float* logits, const float* m, const float* s,
                                            const std::int32_t* targets, int v_begin, float dloss, int N, int V) {
#pragma omp parallel for schedule(static) if (std::int64_t(N) * V >= (1 << 15))
  for (int n = 0; n < N; ++n) {
    const float* x = logits + std::int64_t(n) * V;
    float* dx = dlogits + std::int64_t(n) * V;
    const float scale = float(double(dloss) / double(s[n]));
    const float mn = m[n];
#pragma omp simd
    for (int i = 0; i < V; ++i) dx[i] = exp_vec(x[i] - mn) * scale;
    const int t = targets[n] - v_begin;
    if (t >= 0 && t < V) dx[t] -= dloss;
  }
}

}  // namespace strata::kernels::cpu
