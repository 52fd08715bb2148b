// Token + position embedding: a gather on the way forward, a scatter-add on
// the way back. Token ids are int32 and assumed in [0, V); the data loader
// checks them once rather than every kernel call.
#include <omp.h>

#include <cstdint>

#include "kernels/kernels.hpp"

namespace strata::kernels {

void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                       int C) {
#pragma omp parallel for collapse(2) schedule(static) if (std::int64_t(B) * T * C >= (1 << 15))
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const std::int64_t n = std::int64_t(b) * T + t;
      const float* te = wte + std::int64_t(tokens[n]) * C;
      const float* pe = wpe + std::int64_t(t) * C;
      float* y = out + n * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) y[c] = te[c] + pe[c];
    }
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int B, int T, int C) {
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
        float* dte = dwte + std::int64_t(tokens[n]) * C;
        float* dpe = dwpe + std::int64_t(t) * C;
#pragma omp simd
        for (int c = c_begin; c < c_end; ++c) {
          dte[c] += dy[c];
          dpe[c] += dy[c];
        }
      }
    }
  }
}

}  // namespace strata::kernels
