// Pointwise kernels: bias, GELU, residual adds, scaling, zeroing and the
// sum of squares behind gradient-norm clipping. All are memory-bound, so the
// aim is one pass over memory, vector instructions, and threads once the
// array is big enough to pay for waking them.
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/vec_math.hpp"

namespace strata::kernels::cpu {
namespace {

using kernels::exp_vec;

// Below this many elements a parallel region costs more than the loop.
constexpr std::int64_t kParallelMin = 1 << 16;

constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

}  // namespace

void bias_add(float* out, const float* bias, int N, int C) {
#pragma omp parallel for schedule(static) if (std::int64_t(N) * C >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    float* row = out + std::int64_t(n) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) row[c] += bias[c];
  }
}

void bias_backward(float* dbias, const float* dout, int N, int C) {
  // Each thread owns a slice of columns, so no two threads write one dbias
  // element; partial sums are in double because N may be tens of thousands.
#pragma omp parallel if (std::int64_t(N) * C >= kParallelMin)
  {
    const int nt = omp_get_num_threads(), it = omp_get_thread_num();
    const int c_begin = int(std::int64_t(C) * it / nt), c_end = int(std::int64_t(C) * (it + 1) / nt);
    constexpr int kBlock = 64;
    for (int c0 = c_begin; c0 < c_end; c0 += kBlock) {
      const int width = (c_end - c0 < kBlock) ? c_end - c0 : kBlock;
      double acc[kBlock] = {};
      for (int n = 0; n < N; ++n) {
        const float* row = dout + std::int64_t(n) * C + c0;
#pragma omp simd
        for (int c = 0; c < width; ++c) acc[c] += row[c];
      }
      for (int c = 0; c < width; ++c) dbias[c0 + c] += float(acc[c]);
    }
  }
}

// GELU with the tanh approximation, written through the identity
// 0.5 (1 + tanh(u)) = sigmoid(2u): out = x / (1 + exp(-2u)). The sigmoid form
// has no cancellation for small u, unlike 1 - 2 / (exp(2u) + 1).
void gelu_forward(float* out, const float* inp, std::int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kGeluS * (x + kGeluA * x * x * x);
    out[i] = x / (1.0f + exp_vec(-2.0f * u));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) {
  // d/dx [x sigmoid(2u)] = sig + x * 2 u' sig (1 - sig), with 1 - sig = e sig
  // computed without subtracting from 1.
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kGeluS * (x + kGeluA * x * x * x);
    const float du = kGeluS * (1.0f + 3.0f * kGeluA * x * x);
    const float e = exp_vec(-2.0f * u);
    const float sig = 1.0f / (1.0f + e);
    const float grad = sig + 2.0f * x * du * (e * sig) * sig;
    dinp[i] += grad * dout[i];
  }
}

void swiglu_forward(float* out, const float* inp, int N, int F) {
#pragma omp parallel for schedule(static) if (std::int64_t(N) * F >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    const float* gate = inp + std::int64_t(n) * 2 * F;
    const float* up = gate + F;
    float* y = out + std::int64_t(n) * F;
#pragma omp simd
    for (int i = 0; i < F; ++i) y[i] = gate[i] / (1.0f + exp_vec(-gate[i])) * up[i];
  }
}

void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) {
  // silu(g) = g sig(g), silu'(g) = sig (1 + g (1 - sig)).
#pragma omp parallel for schedule(static) if (std::int64_t(N) * F >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    const float* gate = inp + std::int64_t(n) * 2 * F;
    const float* up = gate + F;
    const float* dy = dout + std::int64_t(n) * F;
    float* dgate = dinp + std::int64_t(n) * 2 * F;
    float* dup = dgate + F;
#pragma omp simd
    for (int i = 0; i < F; ++i) {
      const float g = gate[i], sig = 1.0f / (1.0f + exp_vec(-g));
      dgate[i] += dy[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
      dup[i] += dy[i] * g * sig;
    }
  }
}

void residual_forward(float* out, const float* a, const float* b, std::int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void add_inplace(float* y, const float* x, std::int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void copy_rows(float* dst, std::int64_t ld_dst, const float* src, std::int64_t ld_src, std::int64_t rows,
               std::int64_t cols, bool add) {
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMin)
  for (std::int64_t r = 0; r < rows; ++r) {
    float* d = dst + r * ld_dst;
    const float* x = src + r * ld_src;
    if (add) {
#pragma omp simd
      for (std::int64_t c = 0; c < cols; ++c) d[c] += x[c];
    } else {
#pragma omp simd
      for (std::int64_t c = 0; c < cols; ++c) d[c] = x[c];
    }
  }
}

void scale_inplace(float* x, float s, std::int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) x[i] *= s;
}

void fill_zero(float* x, std::int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) x[i] = 0.0f;
}

double sum_squares(const float* x, std::int64_t n) {
  double acc = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : acc) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) acc += double(x[i]) * double(x[i]);
  return acc;
}

}  // namespace strata::kernels::cpu
