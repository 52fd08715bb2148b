// Token + position embedding: a gather on the way forward; on the way back a
// scatter-add that a thread per channel runs over every row in order, so a
// repeated token needs no atomics and the sums' order is the CPU backend's.
// Tables and rows in the call's format; the gradients fp32.
#include "kernels/kokkos/kokkos_kernels.hpp"
#include "kernels/kokkos/views.hpp"

namespace strata::kernels::kokkos {

namespace {

template <typename E>
void embedding_forward_(E* out, const std::int32_t* tokens, const E* wte, const E* wpe, int B, int T, int C,
                        int v_begin, int v_count) {
  Kokkos::parallel_for(
      "strata::embedding_forward", rows_policy(std::int64_t(B) * T), KOKKOS_LAMBDA(const Member& m) {
        const std::int64_t n = m.league_rank();
        const int t = int(n % T), row = tokens[n] - v_begin;
        const bool local = v_count < 0 || (row >= 0 && row < v_count);
        E* y = out + n * C;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, C), [&](int c) {
          float v = local ? to_float(wte[std::int64_t(row) * C + c]) : 0.0f;
          if (wpe != nullptr) v += to_float(wpe[std::int64_t(t) * C + c]);
          y[c] = from_float<E>(v);
        });
      });
}

template <typename E>
void embedding_backward_(float* dwte, float* dwpe, const E* dout, const std::int32_t* tokens, int B, int T, int C,
                         int v_begin, int v_count) {
  const std::int64_t N = std::int64_t(B) * T;
  Kokkos::parallel_for(
      "strata::embedding_backward", Range(0, C), KOKKOS_LAMBDA(std::int64_t c) {
        for (std::int64_t n = 0; n < N; ++n) {
          const float g = to_float(dout[n * C + c]);
          const int row = tokens[n] - v_begin;
          if (v_count < 0 || (row >= 0 && row < v_count)) dwte[std::int64_t(row) * C + c] += g;
          if (dwpe != nullptr) dwpe[(n % T) * C + c] += g;
        }
      });
}

template <typename E>
void add_position_rows_(E* out, const E* wpe, int rows, int C, int T, int r0) {
  Kokkos::parallel_for(
      "strata::add_position_rows", rows_policy(rows), KOKKOS_LAMBDA(const Member& m) {
        const int i = m.league_rank();
        E* o = out + std::int64_t(i) * C;
        const E* p = wpe + std::int64_t((r0 + i) % T) * C;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, C), [&](int c) { o[c] = from_float<E>(to_float(o[c]) + to_float(p[c])); });
      });
}

}  // namespace

void embedding_forward(core::Ptr out, const std::int32_t* tokens, core::CPtr wte, core::CPtr wpe, int B, int T, int C,
                       int v_begin, int v_count) {
  STRATA_BY_FORMAT(out, embedding_forward_(out.as<E>(), tokens, wte.as<E>(), wpe.as<E>(), B, T, C, v_begin, v_count));
}

void embedding_backward(float* dwte, float* dwpe, core::CPtr dout, const std::int32_t* tokens, int B, int T, int C,
                        int v_begin, int v_count) {
  STRATA_BY_FORMAT(dout, embedding_backward_(dwte, dwpe, dout.as<E>(), tokens, B, T, C, v_begin, v_count));
}

void add_position_rows(core::Ptr out, core::CPtr wpe, int rows, int C, int T, int r0) {
  STRATA_BY_FORMAT(out, add_position_rows_(out.as<E>(), wpe.as<E>(), rows, C, T, r0));
}

}  // namespace strata::kernels::kokkos
