// Softmax cross-entropy over the vocabulary, fused and in the
// vocabulary-parallel pieces: a team per row; row sums of exponentials in
// double (a float sum of 50k terms drifts); the backward may overwrite the
// logits in place, since every element is read before the row is written.
#include <cmath>

#include "kernels/kokkos/kokkos_kernels.hpp"
#include "kernels/kokkos/views.hpp"
#include "kernels/vec_math.hpp"

namespace strata::kernels::kokkos {

namespace {

// sum_i exp(x[i] - mx), in double over the team (team_sum's groups of eight).
KOKKOS_INLINE_FUNCTION double team_exp_sum(const Member& m, const float* x, float mx, int V) {
  return team_sum<double>(m, V, [&](int i) { return double(exp_vec(x[i] - mx)); });
}

}  // namespace

void softmax_cross_entropy_forward(float* losses, const float* logits, const std::int32_t* targets, int N, int V) {
  Kokkos::parallel_for(
      "strata::cross_entropy_forward", rows_policy(N), KOKKOS_LAMBDA(const Member& m) {
        const int n = m.league_rank();
        const float* x = logits + std::int64_t(n) * V;
        const float mx = team_max(m, x, V);
        const double sum = team_exp_sum(m, x, mx, V);
        Kokkos::single(Kokkos::PerTeam(m),
                       [&] { losses[n] = float(double(mx) + kmath::log(sum) - double(x[targets[n]])); });
      });
}

void softmax_cross_entropy_backward(float* dlogits, const float* logits, const std::int32_t* targets, float dloss,
                                    int N, int V) {
  Kokkos::parallel_for(
      "strata::cross_entropy_backward", rows_policy(N), KOKKOS_LAMBDA(const Member& m) {
        const int n = m.league_rank();
        const float* x = logits + std::int64_t(n) * V;
        float* dx = dlogits + std::int64_t(n) * V;
        const float mx = team_max(m, x, V);
        const float scale = float(double(dloss) / team_exp_sum(m, x, mx, V));
        m.team_barrier();
        const int t = targets[n];
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, V), [&](int i) {
          const float g = exp_vec(x[i] - mx) * scale;
          dx[i] = i == t ? g - dloss : g;
        });
      });
}

void row_max(float* m, const float* logits, int N, int V) {
  Kokkos::parallel_for(
      "strata::row_max", rows_policy(N), KOKKOS_LAMBDA(const Member& mb) {
        const int n = mb.league_rank();
        const float mx = team_max(mb, logits + std::int64_t(n) * V, V);
        Kokkos::single(Kokkos::PerTeam(mb), [&] { m[n] = mx; });
      });
}

void row_exp_sum(float* s, const float* logits, const float* m, int N, int V) {
  Kokkos::parallel_for(
      "strata::row_exp_sum", rows_policy(N), KOKKOS_LAMBDA(const Member& mb) {
        const int n = mb.league_rank();
        const double sum = team_exp_sum(mb, logits + std::int64_t(n) * V, m[n], V);
        Kokkos::single(Kokkos::PerTeam(mb), [&] { s[n] = float(sum); });
      });
}

void pick_target_logits(float* x, const float* logits, const std::int32_t* targets, int v_begin, int N, int V) {
  Kokkos::parallel_for(
      "strata::pick_target_logits", Range(0, N), KOKKOS_LAMBDA(std::int64_t n) {
        const int t = targets[n] - v_begin;
        x[n] = (t >= 0 && t < V) ? logits[n * V + t] : 0.0f;
      });
}

void cross_entropy_from_parts(float* losses, const float* m, const float* s, const float* x, int N) {
  Kokkos::parallel_for(
      "strata::cross_entropy_from_parts", Range(0, N), KOKKOS_LAMBDA(std::int64_t n) {
        losses[n] = float(double(m[n]) + kmath::log(double(s[n])) - double(x[n]));
      });
}

void softmax_cross_entropy_backward_sharded(float* dlogits, const float* logits, const float* m, const float* s,
                                            const std::int32_t* targets, int v_begin, float dloss, int N, int V) {
  Kokkos::parallel_for(
      "strata::cross_entropy_backward_sharded", rows_policy(N), KOKKOS_LAMBDA(const Member& mb) {
        const int n = mb.league_rank();
        const float* x = logits + std::int64_t(n) * V;
        float* dx = dlogits + std::int64_t(n) * V;
        const float scale = float(double(dloss) / double(s[n]));
        const float mn = m[n];
        const int t = targets[n] - v_begin;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(mb, V), [&](int i) {
          const float g = exp_vec(x[i] - mn) * scale;
          dx[i] = i == t ? g - dloss : g;
        });
      });
}

}  // namespace strata::kernels::kokkos
