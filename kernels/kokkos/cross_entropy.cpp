// Softmax cross-entropy over the vocabulary, fused and in the
// vocabulary-parallel pieces: a team per row; row sums of exponentials in
// double (a float sum of 50k terms drifts); the backward may overwrite the
// logits in place, since every element is read before the row is written.
// Logits and their gradient in the call's format; the row figures fp32.
#include <cmath>

#include "kernels/kokkos/kokkos_kernels.hpp"
#include "kernels/kokkos/views.hpp"
#include "kernels/vec_math.hpp"

namespace strata::kernels::kokkos {

namespace {

// sum_i exp(x[i] - mx), in double over the team (team_sum's groups of eight).
template <typename E>
KOKKOS_INLINE_FUNCTION double team_exp_sum(const Member& m, const E* x, float mx, int V) {
  return team_sum<double>(m, V, [&](int i) { return double(exp_vec(to_float(x[i]) - mx)); });
}

template <typename E>
void forward_(float* losses, const E* logits, const std::int32_t* targets, int N, int V) {
  Kokkos::parallel_for(
      "strata::cross_entropy_forward", rows_policy(N), KOKKOS_LAMBDA(const Member& m) {
        const int n = m.league_rank();
        const E* x = logits + std::int64_t(n) * V;
        const float mx = team_max(m, x, V);
        const double sum = team_exp_sum(m, x, mx, V);
        Kokkos::single(Kokkos::PerTeam(m),
                       [&] { losses[n] = float(double(mx) + kmath::log(sum) - double(to_float(x[targets[n]]))); });
      });
}

template <typename E>
void backward_(E* dlogits, const E* logits, const std::int32_t* targets, float dloss, int N, int V) {
  Kokkos::parallel_for(
      "strata::cross_entropy_backward", rows_policy(N), KOKKOS_LAMBDA(const Member& m) {
        const int n = m.league_rank();
        const E* x = logits + std::int64_t(n) * V;
        E* dx = dlogits + std::int64_t(n) * V;
        const float mx = team_max(m, x, V);
        const float scale = float(double(dloss) / team_exp_sum(m, x, mx, V));
        m.team_barrier();
        const int t = targets[n];
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, V), [&](int i) {
          const float g = exp_vec(to_float(x[i]) - mx) * scale;
          dx[i] = from_float<E>(i == t ? g - dloss : g);
        });
      });
}

template <typename E>
void row_max_(float* m, const E* logits, int N, int V) {
  Kokkos::parallel_for(
      "strata::row_max", rows_policy(N), KOKKOS_LAMBDA(const Member& mb) {
        const int n = mb.league_rank();
        const float mx = team_max(mb, logits + std::int64_t(n) * V, V);
        Kokkos::single(Kokkos::PerTeam(mb), [&] { m[n] = mx; });
      });
}

template <typename E>
void row_exp_sum_(float* s, const E* logits, const float* m, int N, int V) {
  Kokkos::parallel_for(
      "strata::row_exp_sum", rows_policy(N), KOKKOS_LAMBDA(const Member& mb) {
        const int n = mb.league_rank();
        const double sum = team_exp_sum(mb, logits + std::int64_t(n) * V, m[n], V);
        Kokkos::single(Kokkos::PerTeam(mb), [&] { s[n] = float(sum); });
      });
}

template <typename E>
void pick_target_logits_(float* x, const E* logits, const std::int32_t* targets, int v_begin, int N, int V) {
  Kokkos::parallel_for(
      "strata::pick_target_logits", Range(0, N), KOKKOS_LAMBDA(std::int64_t n) {
        const int t = targets[n] - v_begin;
        x[n] = (t >= 0 && t < V) ? to_float(logits[n * V + t]) : 0.0f;
      });
}

template <typename E>
void backward_sharded_(E* dlogits, const E* logits, const float* m, const float* s, const std::int32_t* targets,
                       int v_begin, float dloss, int N, int V) {
  Kokkos::parallel_for(
      "strata::cross_entropy_backward_sharded", rows_policy(N), KOKKOS_LAMBDA(const Member& mb) {
        const int n = mb.league_rank();
        const E* x = logits + std::int64_t(n) * V;
        E* dx = dlogits + std::int64_t(n) * V;
        const float scale = float(double(dloss) / double(s[n]));
        const float mn = m[n];
        const int t = targets[n] - v_begin;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(mb, V), [&](int i) {
          const float g = exp_vec(to_float(x[i]) - mn) * scale;
          dx[i] = from_float<E>(i == t ? g - dloss : g);
        });
      });
}

}  // namespace

void softmax_cross_entropy_forward(float* losses, core::CPtr logits, const std::int32_t* targets, int N, int V) {
  STRATA_BY_FORMAT(logits, forward_(losses, logits.as<E>(), targets, N, V));
}

void softmax_cross_entropy_backward(core::Ptr dlogits, core::CPtr logits, const std::int32_t* targets, float dloss,
                                    int N, int V) {
  STRATA_BY_FORMAT(dlogits, backward_(dlogits.as<E>(), logits.as<E>(), targets, dloss, N, V));
}

void row_max(float* m, core::CPtr logits, int N, int V) { STRATA_BY_FORMAT(logits, row_max_(m, logits.as<E>(), N, V)); }

void row_exp_sum(float* s, core::CPtr logits, const float* m, int N, int V) {
  STRATA_BY_FORMAT(logits, row_exp_sum_(s, logits.as<E>(), m, N, V));
}

void pick_target_logits(float* x, core::CPtr logits, const std::int32_t* targets, int v_begin, int N, int V) {
  STRATA_BY_FORMAT(logits, pick_target_logits_(x, logits.as<E>(), targets, v_begin, N, V));
}

void softmax_cross_entropy_backward_sharded(core::Ptr dlogits, core::CPtr logits, const float* m, const float* s,
                                            const std::int32_t* targets, int v_begin, float dloss, int N, int V) {
  STRATA_BY_FORMAT(dlogits, backward_sharded_(dlogits.as<E>(), logits.as<E>(), m, s, targets, v_begin, dloss, N, V));
}

void cross_entropy_from_parts(float* losses, const float* m, const float* s, const float* x, int N) {
  Kokkos::parallel_for(
      "strata::cross_entropy_from_parts", Range(0, N), KOKKOS_LAMBDA(std::int64_t n) {
        losses[n] = float(double(m[n]) + kmath::log(double(s[n])) - double(x[n]));
      });
}

}  // namespace strata::kernels::kokkos
