// LayerNorm over the last dimension, with the CPU backend's arithmetic: mean,
// then the biased variance of the deviations (two passes, no cancellation),
// rstd saved for the backward pass. The row sums are taken in double: a
// team's sum may run in one thread, in order, where a float sum of a
// thousand values near 100 drifts by 1e-6 (the CPU's eight vector lanes
// drift less). A team per row; dweight and dbias by
// column, summed over the rows in double.
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
        double sum = 0;
        Kokkos::parallel_reduce(Kokkos::TeamThreadRange(m, C), [&](int c, double& s) { s += x(n, c); }, sum);
        const float mn = float(sum / C);
        double var = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, C), [&](int c, double& s) { s += (x(n, c) - mn) * (x(n, c) - mn); }, var);
        const float s = 1.0f / kmath::sqrt(float(var / C) + eps);
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
        double dnorm_sum = 0, dnorm_norm_sum = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, C), [&](int c, double& a) { a += dy(n, c) * w(c); }, dnorm_sum);
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, C), [&](int c, double& a) { a += dy(n, c) * w(c) * ((x(n, c) - mn) * s); },
            dnorm_norm_sum);
        const float dnorm_mean = float(dnorm_sum / C), dnorm_norm_mean = float(dnorm_norm_sum / C);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, C), [&](int c) {
          const float norm = (x(n, c) - mn) * s;
          dx(n, c) += (dy(n, c) * w(c) - dnorm_mean - norm * dnorm_norm_mean) * s;
        });
      });
  const Vec<float> dw(dweight, C), db(dbias, C);
  Kokkos::parallel_for(
      "strata::layernorm_backward_dw", Range(0, C), KOKKOS_LAMBDA(std::int64_t c) {
        double sw = 0, sb = 0;
        for (int n = 0; n < N; ++n) {
          sw += double((x(n, c) - mu(n)) * rs(n) * dy(n, c));
          sb += double(dy(n, c));
        }
        dw(c) += float(sw);
        db(c) += float(sb);
      });
}

}  // namespace strata::kernels::kokkos
