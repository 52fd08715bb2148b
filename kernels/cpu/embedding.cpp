// Token + position embedding: a gather on the way forward, a scatter-add on
// the way back. Token ids are int32 and assumed in [0, V); the data loader
// checks them once rather than every kernel call. Tables and rows are in the
// call's format; the gradients fp32.
#include <omp.h>

#include <cstdint>

#include "kernels/cpu/cpu_kernels.hpp"

namespace strata::kernels::cpu {

namespace {

using core::CPtr;
using core::from_float;
using core::Ptr;
using core::to_float;

template <typename E>
void embedding_forward_(E* out, const std::int32_t* tokens, const E* wte, const E* wpe, int B, int T, int C,
                        int v_begin, int v_count) {
#pragma omp parallel for collapse(2) schedule(static) if (std::int64_t(B) * T * C >= (1 << 15))
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const std::int64_t n = std::int64_t(b) * T + t;
      const int row = tokens[n] - v_begin;
      E* y = out + n * C;
      const bool local = v_count < 0 || (row >= 0 && row < v_count);
      const E* te = local ? wte + std::int64_t(row) * C : nullptr;
      const E* pe = wpe != nullptr ? wpe + std::int64_t(t) * C : nullptr;
#pragma omp simd
      for (int c = 0; c < C; ++c)
        y[c] = from_float<E>((te != nullptr ? to_float(te[c]) : 0.0f) + (pe != nullptr ? to_float(pe[c]) : 0.0f));
    }
  }
}

template <typename E>
void embedding_backward_(float* dwte, float* dwpe, const E* dout, const std::int32_t* tokens, int B, int T, int C,
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
        const E* dy = dout + n * C;
        const int row = tokens[n] - v_begin;
        if (v_count < 0 || (row >= 0 && row < v_count)) {
          float* dte = dwte + std::int64_t(row) * C;
#pragma omp simd
          for (int c = c_begin; c < c_end; ++c) dte[c] += to_float(dy[c]);
        }
        if (dwpe != nullptr) {
          float* dpe = dwpe + std::int64_t(t) * C;
#pragma omp simd
          for (int c = c_begin; c < c_end; ++c) dpe[c] += to_float(dy[c]);
        }
      }
    }
  }
}

template <typename E>
void add_position_rows_(E* out, const E* wpe, int rows, int C, int T, int r0) {
#pragma omp parallel for schedule(static) if (std::int64_t(rows) * C >= (1 << 15))
  for (int i = 0; i < rows; ++i) {
    E* o = out + std::int64_t(i) * C;
    const E* p = wpe + std::int64_t((r0 + i) % T) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = from_float<E>(to_float(o[c]) + to_float(p[c]));
  }
}

}  // namespace

void embedding_forward(Ptr out, const std::int32_t* tokens, CPtr wte, CPtr wpe, int B, int T, int C, int v_begin,
                       int v_count) {
  STRATA_BY_FORMAT(out, embedding_forward_(out.as<E>(), tokens, wte.as<E>(), wpe.as<E>(), B, T, C, v_begin, v_count));
}

void embedding_backward(float* dwte, float* dwpe, CPtr dout, const std::int32_t* tokens, int B, int T, int C,
                        int v_begin, int v_count) {
  STRATA_BY_FORMAT(dout, embedding_backward_(dwte, dwpe, dout.as<E>(), tokens, B, T, C, v_begin, v_count));
}

void add_position_rows(Ptr out, CPtr wpe, int rows, int C, int T, int r0) {
  STRATA_BY_FORMAT(out, add_position_rows_(out.as<E>(), wpe.as<E>(), rows, C, T, r0));
}

}  // namespace strata::kernels::cpu
