// LayerNorm over the last dimension, with the CPU backend's arithmetic: mean,
// then the biased variance of the deviations (two passes, no cancellation),
// rstd saved for the backward pass. A team per row, its sums in groups of
// eight (team_sum: a float sum of a thousand values near 100 taken one by
// one drifts by 1e-6, in groups as little as the CPU's vector lanes); dweight
// and dbias by blocks of columns, summed over the rows in double. RMSNorm
// alike, without the mean: rstd from the mean square.
#include <cmath>

#include "kernels/kokkos/kokkos_kernels.hpp"
#include "kernels/kokkos/views.hpp"

namespace strata::kernels::kokkos {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int N, int C, float eps) {
  const Mat<float> y(out, N, C);
  const Mat<const float> x(inp, N, C);
  const Vec<const float> w(weight, C), b(bias, C);
  const Vec<float> mu(mean, N), rs(rstd, N);
  Kokkos::parallel_for(
      "strata::layernorm_forward", rows_policy(N), KOKKOS_LAMBDA(const Member& m) {
        const int n = m.league_rank();
        const float mn = team_sum<float>(m, C, [&](int c) { return x(n, c); }) / C;
        const float var = team_sum<float>(m, C, [&](int c) { return (x(n, c) - mn) * (x(n, c) - mn); }) / C;
        const float s = 1.0f / kmath::sqrt(var + eps);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, C), [&](int c) { y(n, c) = (x(n, c) - mn) * s * w(c) + b(c); });
        Kokkos::single(Kokkos::PerTeam(m), [&] {
          mu(n) = mn;
          rs(n) = s;
        });
      });
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  const Mat<float> dx(dinp, N, C);
  const Mat<const float> x(inp, N, C), dy(dout, N, C);
  const Vec<const float> w(weight, C), mu(mean, N), rs(rstd, N);
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
          dx(n, c) += (dy(n, c) * w(c) - dnorm_mean - norm * dnorm_norm_mean) * s;
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

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps) {
  const Mat<float> y(out, N, C);
  const Mat<const float> x(inp, N, C);
  const Vec<const float> w(weight, C);
  const Vec<float> rs(rstd, N);
  Kokkos::parallel_for(
      "strata::rmsnorm_forward", rows_policy(N), KOKKOS_LAMBDA(const Member& m) {
        const int n = m.league_rank();
        const float ms = team_sum<float>(m, C, [&](int c) { return x(n, c) * x(n, c); }) / C;
        const float s = 1.0f / kmath::sqrt(ms + eps);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, C), [&](int c) { y(n, c) = x(n, c) * s * w(c); });
        Kokkos::single(Kokkos::PerTeam(m), [&] { rs(n) = s; });
      });
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
  const Mat<float> dx(dinp, N, C);
  const Mat<const float> x(inp, N, C), dy(dout, N, C);
  const Vec<const float> w(weight, C), rs(rstd, N);
  // dx = s (dnorm - norm mean(dnorm norm)), dnorm = dy w, norm = x s: the
  // LayerNorm backward without the mean's term (s depends on x only through
  // the mean square).
  Kokkos::parallel_for(
      "strata::rmsnorm_backward_dx", rows_policy(N), KOKKOS_LAMBDA(const Member& m) {
        const int n = m.league_rank();
        const float s = rs(n);
        const float dnorm_norm_mean = team_sum<float>(m, C, [&](int c) { return dy(n, c) * w(c) * x(n, c) * s; }) / C;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, C), [&](int c) {
          dx(n, c) += (dy(n, c) * w(c) - x(n, c) * s * dnorm_norm_mean) * s;
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

}  // namespace strata::kernels::kokkos
