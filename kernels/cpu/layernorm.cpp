// LayerNorm and RMSNorm over the last dimension, forward and backward.
// LayerNorm has the same arithmetic as llm.c: mean and biased variance per
// row, rstd saved for the backward pass, float throughout except the column
// sums of dweight/dbias; RMSNorm is the same without the mean and the bias.
#include <omp.h>

#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.hpp"

namespace strata::kernels::cpu {

namespace {

using core::CPtr;
using core::from_float;
using core::Ptr;
using core::to_float;

// A norm's weight (and bias) gradients, sums over the N rows: each thread
// owns a slice of columns so that no element has two writers, and `add`
// accumulates row n's terms of columns [c0, c0 + width) in double; the sums
// are then added to dw and (unless null) db.
template <class Add>
void column_sums(int N, int C, bool parallel, Add add, float* dw_out, float* db_out) {
#pragma omp parallel if (parallel)
  {
    const int nt = omp_get_num_threads(), it = omp_get_thread_num();
    const int c_begin = int(std::int64_t(C) * it / nt), c_end = int(std::int64_t(C) * (it + 1) / nt);
    constexpr int kBlock = 64;
    for (int c0 = c_begin; c0 < c_end; c0 += kBlock) {
      const int width = (c_end - c0 < kBlock) ? c_end - c0 : kBlock;
      double dw[kBlock] = {}, db[kBlock] = {};
      for (int n = 0; n < N; ++n) add(n, c0, width, dw, db);
      for (int c = 0; c < width; ++c) {
        dw_out[c0 + c] += float(dw[c]);
        if (db_out != nullptr) db_out[c0 + c] += float(db[c]);
      }
    }
  }
}

template <typename E>
void layernorm_forward_(E* out, float* mean, float* rstd, const E* inp, const E* weight, const E* bias, int N, int C,
                        float eps) {
#pragma omp parallel for schedule(static) if (std::int64_t(N) * C >= (1 << 15))
  for (int n = 0; n < N; ++n) {
    const E* x = inp + std::int64_t(n) * C;
    E* y = out + std::int64_t(n) * C;
    float m = 0.0f;
#pragma omp simd reduction(+ : m)
    for (int c = 0; c < C; ++c) m += to_float(x[c]);
    m /= C;
    // Two passes (mean, then squared deviations) rather than E[x^2] - m^2,
    // which cancels badly when |mean| >> std.
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; ++c) v += (to_float(x[c]) - m) * (to_float(x[c]) - m);
    v /= C;
    const float s = 1.0f / std::sqrt(v + eps);
#pragma omp simd
    for (int c = 0; c < C; ++c) y[c] = from_float<E>((to_float(x[c]) - m) * s * to_float(weight[c]) + to_float(bias[c]));
    mean[n] = m;
    rstd[n] = s;
  }
}

template <typename E>
void layernorm_backward_(E* dinp, float* dweight, float* dbias, const E* dout, const E* inp, const E* weight,
                         const float* mean, const float* rstd, int N, int C) {
  const bool parallel = std::int64_t(N) * C >= (1 << 15);
  // dinp: rows are independent.
#pragma omp parallel for schedule(static) if (parallel)
  for (int n = 0; n < N; ++n) {
    const E* x = inp + std::int64_t(n) * C;
    const E* dy = dout + std::int64_t(n) * C;
    E* dx = dinp + std::int64_t(n) * C;
    const float m = mean[n], s = rstd[n];
    // dnorm = dy * weight; dx = s * (dnorm - mean(dnorm) - norm * mean(dnorm * norm))
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
    for (int c = 0; c < C; ++c) {
      const float norm = (to_float(x[c]) - m) * s;
      const float dnorm = to_float(dy[c]) * to_float(weight[c]);
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
#pragma omp simd
    for (int c = 0; c < C; ++c) {
      const float norm = (to_float(x[c]) - m) * s;
      const float dnorm = to_float(dy[c]) * to_float(weight[c]);
      dx[c] = from_float<E>(to_float(dx[c]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
    }
  }
  column_sums(N, C, parallel, [&](int n, int c0, int width, double* dw, double* db) {
    const E* x = inp + std::int64_t(n) * C + c0;
    const E* dy = dout + std::int64_t(n) * C + c0;
    const float m = mean[n], s = rstd[n];
#pragma omp simd
    for (int c = 0; c < width; ++c) {
      dw[c] += double((to_float(x[c]) - m) * s * to_float(dy[c]));
      db[c] += double(to_float(dy[c]));
    }
  }, dweight, dbias);
}

template <typename E>
void rmsnorm_forward_(E* out, float* rstd, const E* inp, const E* weight, int N, int C, float eps) {
#pragma omp parallel for schedule(static) if (std::int64_t(N) * C >= (1 << 15))
  for (int n = 0; n < N; ++n) {
    const E* x = inp + std::int64_t(n) * C;
    E* y = out + std::int64_t(n) * C;
    float ms = 0.0f;
#pragma omp simd reduction(+ : ms)
    for (int c = 0; c < C; ++c) ms += to_float(x[c]) * to_float(x[c]);
    const float s = 1.0f / std::sqrt(ms / C + eps);
#pragma omp simd
    for (int c = 0; c < C; ++c) y[c] = from_float<E>(to_float(x[c]) * s * to_float(weight[c]));
    rstd[n] = s;
  }
}

template <typename E>
void rmsnorm_backward_(E* dinp, float* dweight, const E* dout, const E* inp, const E* weight, const float* rstd, int N,
                       int C) {
  const bool parallel = std::int64_t(N) * C >= (1 << 15);
#pragma omp parallel for schedule(static) if (parallel)
  for (int n = 0; n < N; ++n) {
    const E* x = inp + std::int64_t(n) * C;
    const E* dy = dout + std::int64_t(n) * C;
    E* dx = dinp + std::int64_t(n) * C;
    const float s = rstd[n];
    // norm = x s; dnorm = dy * weight; dx = s * (dnorm - norm * mean(dnorm * norm))
    float dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_norm_mean)
    for (int c = 0; c < C; ++c) dnorm_norm_mean += to_float(dy[c]) * to_float(weight[c]) * to_float(x[c]) * s;
    dnorm_norm_mean /= C;
#pragma omp simd
    for (int c = 0; c < C; ++c)
      dx[c] = from_float<E>(to_float(dx[c]) +
                            (to_float(dy[c]) * to_float(weight[c]) - to_float(x[c]) * s * dnorm_norm_mean) * s);
  }
  column_sums(N, C, parallel, [&](int n, int c0, int width, double* dw, double*) {
    const E* x = inp + std::int64_t(n) * C + c0;
    const E* dy = dout + std::int64_t(n) * C + c0;
    const float s = rstd[n];
#pragma omp simd
    for (int c = 0; c < width; ++c) dw[c] += double(to_float(x[c]) * s * to_float(dy[c]));
  }, dweight, nullptr);
}

}  // namespace

void layernorm_forward(Ptr out, float* mean, float* rstd, CPtr inp, CPtr weight, CPtr bias, int N, int C, float eps) {
  STRATA_BY_FORMAT(out, layernorm_forward_(out.as<E>(), mean, rstd, inp.as<E>(), weight.as<E>(), bias.as<E>(), N, C, eps));
}

void layernorm_backward(Ptr dinp, float* dweight, float* dbias, CPtr dout, CPtr inp, CPtr weight, const float* mean,
                        const float* rstd, int N, int C) {
  STRATA_BY_FORMAT(dinp, layernorm_backward_(dinp.as<E>(), dweight, dbias, dout.as<E>(), inp.as<E>(), weight.as<E>(),
                                             mean, rstd, N, C));
}

void rmsnorm_forward(Ptr out, float* rstd, CPtr inp, CPtr weight, int N, int C, float eps) {
  STRATA_BY_FORMAT(out, rmsnorm_forward_(out.as<E>(), rstd, inp.as<E>(), weight.as<E>(), N, C, eps));
}

void rmsnorm_backward(Ptr dinp, float* dweight, CPtr dout, CPtr inp, CPtr weight, const float* rstd, int N, int C) {
  STRATA_BY_FORMAT(dinp, rmsnorm_backward_(dinp.as<E>(), dweight, dout.as<E>(), inp.as<E>(), weight.as<E>(), rstd, N, C));
}

}  // namespace strata::kernels::cpu
