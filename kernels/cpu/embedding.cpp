// Token + position embedding: a gather on the way forward, a scatter-add on
// the way back. Token ids are int32 and assumed in [0, V); the data loader
// checks them once rather than every kernel call.
#include <omp.h>

#include <cstdint>

#include "kernels/cpu/cpu_kernels.hpp"

namespace strata::kernels::cpu {

void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                       int C, int v_begin, int v_count) {
#pragma omp parallel for collapse(2) schedule(static) if (std::int64_t(B) * T * C >= (1 << 15))
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const std::int64_t n = std::int64_t(b) * T + t;
      const int row = tokens[n] - v_begin;
      float* y = out + n * C;
      if (v_count >= 0 && (row < 0 || row >= v_count)) {
        for (int c = 0; c < C; ++c) y[c] = 0.0f;
      } else {
        const float* te = wte + std::int64_t(row) * C;
#pragma omp simd
        for (int c = 0; c < C; ++c) y[c] = te[c];
      }
      if (wpe != nullptr) {
        const float* pe = wpe + std::int64_t(t) * C;
#pragma omp simd
        for (int c = 0; c < C; ++c) y[c] += pe[c];
      }
    }
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int B, int T, int C,
                        int v_begin, int v_count) {
  // A token may repeat within the batch, so rows of dwte can have several
  // writers. Splitting the channels (not the rows) among threads keeps every
  // element single-writer and the summation order fixed: results do not
  // depend on the thread count.
#pragma omp parallel if (std::int64_t(B) * T * C >= (1 << 15))
  {
    const int nt = omp_get_num_threads(), it = omp_get_thread_num();
    const int c_begin = int(std::int64_t(C) * it / nt), c_end = int(std::int64_t(C) * (it + 1) / nt);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        const std::int64_t n = std::int64_t(b) * T + t;
        const float* dy = dout + n * C;
        const int row = tokens[n] - v_begin;
        if (v_count < 0 || (row >= 0 && row < v_count)) {
          float* dte = dwte + std::int64_t(row) * C;
#pragma omp simd
          for (int c = c_begin; c < c_end; ++c) dte[c] += dy[c];
        }
        if (dwpe != nullptr) {
          float* dpe = dwpe + std::int64_t(t) * C;
#pragma omp simd
          for (int c = c_begin; c < c_end; ++c) dpe[c] += dy[c];
        }
      }
    }
  }
}

void add_position_rows(float* out, const float* wpe, int rows, int C, int T, int r0) {
#pragma omp parallel for schedule(static) if (std::int64_t(rows) * C >= (1 << 15))
  for (int i = 0; i < rows; ++i) {
    float* o = out + std::int64_t(i) * C;
    const float* p = wpe + std::int64_t((r0 + i) % T) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] += p[c];
  }
}

}  // namespace strata::kernels::cpu
