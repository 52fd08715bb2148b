// Token + position embedding: a gather on the way forward; on the way back a
// scatter-add that a thread per channel runs over every row in order, so a
// repeated token needs no atomics and the sums' order is the CPU backend's.
#include "kernels/kokkos/kokkos_kernels.hpp"
#include "kernels/kokkos/views.hpp"

namespace strata::kernels::kokkos {

void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                       int C, int v_begin, int v_count) {
  Kokkos::parallel_for(
      "strata::embedding_forward", rows_policy(std::int64_t(B) * T), KOKKOS_LAMBDA(const Member& m) {
        const std::int64_t n = m.league_rank();
        const int t = int(n % T), row = tokens[n] - v_begin;
        const bool local = v_count < 0 || (row >= 0 && row < v_count);
        float* y = out + n * C;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, C), [&](int c) {
          float v = local ? wte[std::int64_t(row) * C + c] : 0.0f;
          if (wpe != nullptr) v += wpe[std::int64_t(t) * C + c];
          y[c] = v;
        });
      });
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int B, int T, int C,
                        int v_begin, int v_count) {
  const std::int64_t N = std::int64_t(B) * T;
  Kokkos::parallel_for(
      "strata::embedding_backward", Range(0, C), KOKKOS_LAMBDA(std::int64_t c) {
        for (std::int64_t n = 0; n < N; ++n) {
          const float g = dout[n * C + c];
          const int row = tokens[n] - v_begin;
          if (v_count < 0 || (row >= 0 && row < v_count)) dwte[std::int64_t(row) * C + c] += g;
          if (dwpe != nullptr) dwpe[(n % T) * C + c] += g;
        }
      });
}

void add_position_rows(float* out, const float* wpe, int rows, int C, int T, int r0) {
  Kokkos::parallel_for(
      "strata::add_position_rows", rows_policy(rows), KOKKOS_LAMBDA(const Member& m) {
        const int i = m.league_rank();
        float* o = out + std::int64_t(i) * C;
        const float* p = wpe + std::int64_t((r0 + i) % T) * C;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, C), [&](int c) { o[c] += p[c]; });
      });
}

}  // namespace strata::kernels::kokkos
