// Pointwise kernels: bias, GELU, SwiGLU, residual adds, scaling, zeroing,
// conversions between formats and the sum of squares behind gradient-norm
// clipping. All are memory-bound, so the aim is one pass over memory, vector
// instructions, and threads once the array is big enough to pay for waking
// them. Each is a template over the element type (float, Bf16, Fp16):
// elements are widened to fp32 as they are read and rounded once as they
// are written.
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/vec_math.hpp"

namespace strata::kernels::cpu {
namespace {

using core::CPtr;
using core::from_float;
using core::Ptr;
using core::to_float;
using kernels::exp_vec;

// Below this many elements a parallel region costs more than the loop.
constexpr std::int64_t kParallelMin = 1 << 16;

constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

template <typename E>
void bias_add_(E* out, const E* bias, int N, int C) {
#pragma omp parallel for schedule(static) if (std::int64_t(N) * C >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    E* row = out + std::int64_t(n) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) row[c] = from_float<E>(to_float(row[c]) + to_float(bias[c]));
  }
}

template <typename E>
void bias_backward_(float* dbias, const E* dout, int N, int C) {
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
        const E* row = dout + std::int64_t(n) * C + c0;
#pragma omp simd
        for (int c = 0; c < width; ++c) acc[c] += to_float(row[c]);
      }
      for (int c = 0; c < width; ++c) dbias[c0 + c] += float(acc[c]);
    }
  }
}

// GELU with the tanh approximation, written through the identity
// 0.5 (1 + tanh(u)) = sigmoid(2u): out = x / (1 + exp(-2u)). The sigmoid form
// has no cancellation for small u, unlike 1 - 2 / (exp(2u) + 1).
template <typename E>
void gelu_forward_(E* out, const E* inp, std::int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = to_float(inp[i]);
    const float u = kGeluS * (x + kGeluA * x * x * x);
    out[i] = from_float<E>(x / (1.0f + exp_vec(-2.0f * u)));
  }
}

template <typename E>
void gelu_backward_(E* dinp, const E* inp, const E* dout, std::int64_t n) {
  // d/dx [x sigmoid(2u)] = sig + x * 2 u' sig (1 - sig), with 1 - sig = e sig
  // computed without subtracting from 1.
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = to_float(inp[i]);
    const float u = kGeluS * (x + kGeluA * x * x * x);
    const float du = kGeluS * (1.0f + 3.0f * kGeluA * x * x);
    const float e = exp_vec(-2.0f * u);
    const float sig = 1.0f / (1.0f + e);
    const float grad = sig + 2.0f * x * du * (e * sig) * sig;
    dinp[i] = from_float<E>(to_float(dinp[i]) + grad * to_float(dout[i]));
  }
}

template <typename E>
void swiglu_forward_(E* out, const E* inp, int N, int F) {
#pragma omp parallel for schedule(static) if (std::int64_t(N) * F >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    const E* gate = inp + std::int64_t(n) * 2 * F;
    const E* up = gate + F;
    E* y = out + std::int64_t(n) * F;
#pragma omp simd
    for (int i = 0; i < F; ++i) {
      const float g = to_float(gate[i]);
      y[i] = from_float<E>(g / (1.0f + exp_vec(-g)) * to_float(up[i]));
    }
  }
}

template <typename E>
void swiglu_backward_(E* dinp, const E* inp, const E* dout, int N, int F) {
  // silu(g) = g sig(g), silu'(g) = sig (1 + g (1 - sig)).
#pragma omp parallel for schedule(static) if (std::int64_t(N) * F >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    const E* gate = inp + std::int64_t(n) * 2 * F;
    const E* up = gate + F;
    const E* dy = dout + std::int64_t(n) * F;
    E* dgate = dinp + std::int64_t(n) * 2 * F;
    E* dup = dgate + F;
#pragma omp simd
    for (int i = 0; i < F; ++i) {
      const float g = to_float(gate[i]), u = to_float(up[i]), d = to_float(dy[i]);
      const float sig = 1.0f / (1.0f + exp_vec(-g));
      dgate[i] = from_float<E>(to_float(dgate[i]) + d * u * sig * (1.0f + g * (1.0f - sig)));
      dup[i] = from_float<E>(to_float(dup[i]) + d * g * sig);
    }
  }
}

template <typename E>
void residual_forward_(E* out, const E* a, const E* b, std::int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) out[i] = from_float<E>(to_float(a[i]) + to_float(b[i]));
}

template <typename Y, typename X>
void add_inplace_(Y* y, const X* x, std::int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) y[i] = from_float<Y>(to_float(y[i]) + to_float(x[i]));
}

template <typename Y, typename X>
void convert_(Y* y, const X* x, std::int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) y[i] = from_float<Y>(to_float(x[i]));
}

template <typename D, typename S>
void copy_rows_(D* dst, std::int64_t ld_dst, const S* src, std::int64_t ld_src, std::int64_t rows, std::int64_t cols,
                bool add) {
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMin)
  for (std::int64_t r = 0; r < rows; ++r) {
    D* d = dst + r * ld_dst;
    const S* x = src + r * ld_src;
    if (add) {
#pragma omp simd
      for (std::int64_t c = 0; c < cols; ++c) d[c] = from_float<D>(to_float(d[c]) + to_float(x[c]));
    } else {
#pragma omp simd
      for (std::int64_t c = 0; c < cols; ++c) d[c] = from_float<D>(to_float(x[c]));
    }
  }
}

template <typename E>
void scale_inplace_(E* x, float s, std::int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) x[i] = from_float<E>(to_float(x[i]) * s);
}

template <typename E>
double sum_squares_(const E* x, std::int64_t n) {
  double acc = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : acc) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = to_float(x[i]);
    acc += v * v;
  }
  return acc;
}

}  // namespace

void bias_add(Ptr out, CPtr bias, int N, int C) { STRATA_BY_FORMAT(out, bias_add_(out.as<E>(), bias.as<E>(), N, C)); }

void bias_backward(float* dbias, CPtr dout, int N, int C) {
  STRATA_BY_FORMAT(dout, bias_backward_(dbias, dout.as<E>(), N, C));
}

void gelu_forward(Ptr out, CPtr inp, std::int64_t n) { STRATA_BY_FORMAT(out, gelu_forward_(out.as<E>(), inp.as<E>(), n)); }

void gelu_backward(Ptr dinp, CPtr inp, CPtr dout, std::int64_t n) {
  STRATA_BY_FORMAT(dinp, gelu_backward_(dinp.as<E>(), inp.as<E>(), dout.as<E>(), n));
}

void swiglu_forward(Ptr out, CPtr inp, int N, int F) {
  STRATA_BY_FORMAT(out, swiglu_forward_(out.as<E>(), inp.as<E>(), N, F));
}

void swiglu_backward(Ptr dinp, CPtr inp, CPtr dout, int N, int F) {
  STRATA_BY_FORMAT(dinp, swiglu_backward_(dinp.as<E>(), inp.as<E>(), dout.as<E>(), N, F));
}

void residual_forward(Ptr out, CPtr a, CPtr b, std::int64_t n) {
  STRATA_BY_FORMAT(out, residual_forward_(out.as<E>(), a.as<E>(), b.as<E>(), n));
}

void add_inplace(Ptr y, CPtr x, std::int64_t n) {
  core::with_formats(y.precision(), x.precision(), [&](auto yt, auto xt) {
    add_inplace_(y.as<decltype(yt)>(), x.as<decltype(xt)>(), n);
  });
}

void convert(Ptr y, CPtr x, std::int64_t n) {
  core::with_formats(y.precision(), x.precision(), [&](auto yt, auto xt) {
    convert_(y.as<decltype(yt)>(), x.as<decltype(xt)>(), n);
  });
}

void copy_rows(Ptr dst, std::int64_t ld_dst, CPtr src, std::int64_t ld_src, std::int64_t rows, std::int64_t cols,
               bool add) {
  core::with_formats(dst.precision(), src.precision(), [&](auto dt, auto st) {
    copy_rows_(dst.as<decltype(dt)>(), ld_dst, src.as<decltype(st)>(), ld_src, rows, cols, add);
  });
}

void scale_inplace(Ptr x, float s, std::int64_t n) { STRATA_BY_FORMAT(x, scale_inplace_(x.as<E>(), s, n)); }

void fill_zero(Ptr x, std::int64_t n) {
  // Zero is all-zero bits in every format.
  if (n > 0) std::memset(x.get(), 0, std::size_t(n) * std::size_t(x.element_bytes()));
}

double sum_squares(CPtr x, std::int64_t n) {
  double s = 0;
  STRATA_BY_FORMAT(x, s = sum_squares_(x.as<E>(), n));
  return s;
}

}  // namespace strata::kernels::cpu
