// LayerNorm over the last dimension, with the CPU backend's arithmetic: mean,
// then the biased variance of the deviations (two passes, no cancellation),
// rstd saved for the backward pass. A team per row, its sums in groups of
// eight (team_sum: a float sum of a thousand values near 100 taken one by
// one drifts by 1e-6, in groups as little as the CPU's vector lanes); dweight
// and dbias by blocks of columns, summed over the rows in double. RMSNorm
// alike, without the mean: rstd from the mean square. Rows and weights in the
// call's format, read as fp32; outputs rounded once; statistics and weight
// gradients fp32.
#include <cmath>
#include <type_traits>

#include "kernels/kokkos/kokkos_kernels.hpp"
#include "kernels/kokkos/views.hpp"

namespace strata::kernels::kokkos {

namespace {

// A row-major [rows, cols] matrix of E read as fp32 (x(n, c)) and written
// rounded (set(n, c, v)): the views of the templates below.
template <typename E>
struct Rows {
  E* p;
  int cols;
  KOKKOS_INLINE_FUNCTION float operator()(std::int64_t n, std::int64_t c) const { return to_float(p[n * cols + c]); }
  KOKKOS_INLINE_FUNCTION float operator()(std::int64_t i) const { return to_float(p[i]); }
  KOKKOS_INLINE_FUNCTION void set(std::int64_t n, std::int64_t c, float v) const { p[n * cols + c] = from_float<std::remove_const_t<E>>(v); }
};

template <typename E>
void layernorm_forward_(E* out, float* mean, float* rstd, const E* inp, const E* weight, const E* bias, int N, int C,
                        float eps) {
  const Rows<E> y{out, C};
  const Rows<const E> x{inp, C}, w{weight, C}, b{bias, C};
  const Vec<float> mu(mean, N), rs(rstd, N);
  Kokkos::parallel_for(
      "strata::layernorm_forward", rows_policy(N), KOKKOS_LAMBDA(const Member& m) {
        const int n = m.league_rank();
        const float mn = team_sum<float>(m, C, [&](int c) { return x(n, c); }) / C;
        const float var = team_sum<float>(m, C, [&](int c) { return (x(n, c) - mn) * (x(n, c) - mn); }) / C;
        const float s = 1.0f / kmath::sqrt(var + eps);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, C), [&](int c) { y.set(n, c, (x(n, c) - mn) * s * w(c) + b(c)); });
        Kokkos::single(Kokkos::PerTeam(m), [&] {
          mu(n) = mn;
          rs(n) = s;
        });
      });
}

template <typename E>
void layernorm_backward_(E* dinp, float* dweight, float* dbias, const E* dout, const E* inp, const E* weight,
                         const float* mean, const float* rstd, int N, int C) {
  const Rows<E> dx{dinp, C};
  const Rows<const E> x{inp, C}, dy{dout, C}, w{weight, C};
  const Vec<const float> mu(mean, N), rs(rstd, N);
  // dx = s (dnorm - mean(dnorm) - norm mean(dnorm norm)), dnorm = dy w.
  Kokkos::parallel_for(
      "strata::layernorm_backward_dx", rows_policy(N), KOKKOS_LAMBDA(const Member& m) {
        const int n = m.league_rank();
        const float mn = mu(n), s = rs(n);
        const float dnorm_mean = team_sum<float>(m, C, [&](int c) { return dy(n, c) * w(c); }) / C;
        const float dnorm_norm_mean =
            team_sum<float>(m, C, [&](int c) { return dy(n, c) * w(c) * ((x(n, c) - mn) * s); }) / C;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, C), [&](int c) {
          const float norm = (x(n, c) - mn) * s;
          dx.set(n, c, dx(n, c) + (dy(n, c) * w(c) - dnorm_mean - norm * dnorm_norm_mean) * s);
        });
      });
  const Vec<float> dw(dweight, C), db(dbias, C);
  Kokkos::parallel_for(
      "strata::layernorm_backward_dw", column_blocks(C), KOKKOS_LAMBDA(std::int64_t blk) {
        const int c0 = int(blk) * kColumnBlock, width = C - c0 < kColumnBlock ? C - c0 : kColumnBlock;
        double sw[kColumnBlock] = {}, sb[kColumnBlock] = {};
        for (int n = 0; n < N; ++n)
          for (int l = 0; l < width; ++l) {
            sw[l] += double((x(n, c0 + l) - mu(n)) * rs(n) * dy(n, c0 + l));
            sb[l] += double(dy(n, c0 + l));
          }
        for (int l = 0; l < width; ++l) {
          dw(c0 + l) += float(sw[l]);
          db(c0 + l) += float(sb[l]);
        }
      });
}

template <typename E>
void rmsnorm_forward_(E* out, float* rstd, const E* inp, const E* weight, int N, int C, float eps) {
  const Rows<E> y{out, C};
  const Rows<const E> x{inp, C}, w{weight, C};
  const Vec<float> rs(rstd, N);
  Kokkos::parallel_for(
      "strata::rmsnorm_forward", rows_policy(N), KOKKOS_LAMBDA(const Member& m) {
        const int n = m.league_rank();
        const float ms = team_sum<float>(m, C, [&](int c) { return x(n, c) * x(n, c); }) / C;
        const float s = 1.0f / kmath::sqrt(ms + eps);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, C), [&](int c) { y.set(n, c, x(n, c) * s * w(c)); });
        Kokkos::single(Kokkos::PerTeam(m), [&] { rs(n) = s; });
      });
}

template <typename E>
void rmsnorm_backward_(E* dinp, float* dweight, const E* dout, const E* inp, const E* weight, const float* rstd, int N,
                       int C) {
  const Rows<E> dx{dinp, C};
  const Rows<const E> x{inp, C}, dy{dout, C}, w{weight, C};
  const Vec<const float> rs(rstd, N);
  // dx = s (dnorm - norm mean(dnorm norm)), dnorm = dy w, norm = x s: the
  // LayerNorm backward without the mean's term (s depends on x only through
  // the mean square).
  Kokkos::parallel_for(
      "strata::rmsnorm_backward_dx", rows_policy(N), KOKKOS_LAMBDA(const Member& m) {
        const int n = m.league_rank();
        const float s = rs(n);
        const float dnorm_norm_mean = team_sum<float>(m, C, [&](int c) { return dy(n, c) * w(c) * x(n, c) * s; }) / C;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, C), [&](int c) {
          dx.set(n, c, dx(n, c) + (dy(n, c) * w(c) - x(n, c) * s * dnorm_norm_mean) * s);
        });
      });
  const Vec<float> dw(dweight, C);
  Kokkos::parallel_for(
      "strata::rmsnorm_backward_dw", column_blocks(C), KOKKOS_LAMBDA(std::int64_t blk) {
        const int c0 = int(blk) * kColumnBlock, width = C - c0 < kColumnBlock ? C - c0 : kColumnBlock;
        double sw[kColumnBlock] = {};
        for (int n = 0; n < N; ++n)
          for (int l = 0; l < width; ++l) sw[l] += double(x(n, c0 + l) * rs(n) * dy(n, c0 + l));
        for (int l = 0; l < width; ++l) dw(c0 + l) += float(sw[l]);
      });
}

}  // namespace

void layernorm_forward(core::Ptr out, float* mean, float* rstd, core::CPtr inp, core::CPtr weight, core::CPtr bias, int N,
                       int C, float eps) {
  STRATA_BY_FORMAT(out, layernorm_forward_(out.as<E>(), mean, rstd, inp.as<E>(), weight.as<E>(), bias.as<E>(), N, C, eps));
}

void layernorm_backward(core::Ptr dinp, float* dweight, float* dbias, core::CPtr dout, core::CPtr inp,
                        core::CPtr weight, const float* mean, const float* rstd, int N, int C) {
  STRATA_BY_FORMAT(dinp, layernorm_backward_(dinp.as<E>(), dweight, dbias, dout.as<E>(), inp.as<E>(), weight.as<E>(),
                                             mean, rstd, N, C));
}

void rmsnorm_forward(core::Ptr out, float* rstd, core::CPtr inp, core::CPtr weight, int N, int C, float eps) {
  STRATA_BY_FORMAT(out, rmsnorm_forward_(out.as<E>(), rstd, inp.as<E>(), weight.as<E>(), N, C, eps));
}

void rmsnorm_backward(core::Ptr dinp, float* dweight, core::CPtr dout, core::CPtr inp, core::CPtr weight,
                      const float* rstd, int N, int C) {
  STRATA_BY_FORMAT(dinp, rmsnorm_backward_(dinp.as<E>(), dweight, dout.as<E>(), inp.as<E>(), weight.as<E>(), rstd, N, C));
}

}  // namespace strata::kernels::kokkos
