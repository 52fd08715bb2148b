// Fused softmax + cross-entropy over the vocabulary. The logits are the
// largest activation of a GPT (N x V with V ~ 50k), so the forward reads
// them twice and the backward overwrites them in place with their gradient.
#include <cmath>
#include <cstdint>

#include <bit>

#include "kernels/kernels.hpp"

namespace strata::kernels {
namespace {

// exp(x) to within 2 ulp, vectorisable; see elementwise.cpp for the why and
// the how (the two copies must stay identical). Here the arguments are
// x - max(x) <= 0, and exp(-87) = 1.6e-38 stands in for anything smaller.
inline float exp_vec(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  std::uint32_t mag = bits & 0x7fffffffu;
  constexpr std::uint32_t kLimit = 0x42ae0000u;  // 87.0f
  mag = (mag > 0x7f800000u || mag < kLimit) ? mag : kLimit;
  x = std::bit_cast<float>((bits & 0x80000000u) | mag);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f;  // ln2 split in two so that n * hi is exact
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const std::int32_t two_n = (static_cast<std::int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(two_n);
}

float row_max(const float* x, int V) {
  float m = x[0];
#pragma omp simd reduction(max : m)
  for (int i = 0; i < V; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

}  // namespace

void softmax_cross_entropy_forward(float* losses, const float* logits, const std::int32_t* targets, int N, int V) {
#pragma omp parallel for schedule(static) if (std::int64_t(N) * V >= (1 << 15))
  for (int n = 0; n < N; ++n) {
    const float* x = logits + std::int64_t(n) * V;
    const float m = row_max(x, V);
    // The exponentials are float (each within 2 ulp); their sum is double so
    // that 50k terms add no error of their own.
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < V; ++i) sum += double(exp_vec(x[i] - m));
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
    const float m = row_max(x, V);
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < V; ++i) {
      const float e = exp_vec(x[i] - m);
      dx[i] = e;
      sum += double(e);
    }
    const float scale = float(double(dloss) / sum);
#pragma omp simd
    for (int i = 0; i < V; ++i) dx[i] *= scale;
    dx[targets[n]] -= dloss;
  }
}

}  // namespace strata::kernels
