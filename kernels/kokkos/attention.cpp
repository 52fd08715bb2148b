// Causal multi-head self-attention, with the CPU backend's algorithm and
// state: per (batch, head), S = q k^T scaled through KokkosBlas (row blocks
// of 64 that skip the upper triangle), a causal softmax kernel in place (a
// team per row), and P v into the head's columns of out; the backward pass
// runs the same products transposed around a softmax-backward kernel.
//
// Ring attention's blocks (context parallelism) keep no T x T scores: a team
// per query row recomputes each score from q and k where it needs it (the
// forward's max, sum and output passes), and the backward runs one kernel
// per query row (dq) and one per key row (dk, dv), so that every gradient
// element has one writer and needs no atomics.
#include <cmath>
#include <limits>

#include "kernels/kokkos/kokkos_kernels.hpp"
#include "kernels/kokkos/views.hpp"
#include "kernels/vec_math.hpp"

namespace strata::kernels::kokkos {

namespace {

constexpr int kRowBlock = 64;

// Rows [r0, r1) of every (b, h): S = scale q k^T for keys [0, r1), or the
// backward's products; `each` is called with the head's pointers.
template <class F>
void for_each_head_block(int B, int NH, int T, F&& each) {
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int r0 = 0; r0 < T; r0 += kRowBlock) each(b, h, r0, r0 + kRowBlock < T ? r0 + kRowBlock : T);
}

}  // namespace

void attention_forward(float* out, float* probs, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
  const std::int64_t TT = std::int64_t(T) * T;
  for_each_head_block(B, NH, T, [&](int b, int h, int r0, int r1) {
    const float* q = qkv + std::int64_t(b) * T * C3 + h * hs;
    float* att = probs + (std::int64_t(b) * NH + h) * TT;
    matmul(false, true, r1 - r0, r1, hs, scale, q + std::int64_t(r0) * C3, C3, q + C, C3, 0.0f,
           att + std::int64_t(r0) * T, T);
  });
  // Row t of each (b, h): the softmax of its first t + 1 scores, zeros after.
  Kokkos::parallel_for(
      "strata::attention_softmax", rows_policy(std::int64_t(B) * NH * T), KOKKOS_LAMBDA(const Member& m) {
        const std::int64_t r = m.league_rank();
        const int t = int(r % T), n = t + 1;
        float* row = probs + r * T;
        const float mx = team_max(m, row, n);
        const float sum = team_sum<float>(m, n, [&](int j) {
          row[j] = exp_vec(row[j] - mx);
          return row[j];
        });
        m.team_barrier();
        const float inv = 1.0f / sum;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, T), [&](int j) { row[j] = j < n ? row[j] * inv : 0.0f; });
      });
  for_each_head_block(B, NH, T, [&](int b, int h, int r0, int r1) {
    const float* v = qkv + std::int64_t(b) * T * C3 + h * hs + 2 * C;
    const float* att = probs + (std::int64_t(b) * NH + h) * TT;
    float* y = out + std::int64_t(b) * T * C + h * hs;
    matmul(false, false, r1 - r0, hs, r1, 1.0f, att + std::int64_t(r0) * T, T, v, C3, 0.0f,
           y + std::int64_t(r0) * C, C);
  });
}

void attention_backward(float* dqkv, float* dprobs, const float* dout, const float* qkv, const float* /*out*/,
                        const float* probs, int B, int T, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
  const std::int64_t TT = std::int64_t(T) * T;
  for_each_head_block(B, NH, T, [&](int b, int h, int r0, int r1) {
    const float* v = qkv + std::int64_t(b) * T * C3 + h * hs + 2 * C;
    float* dv = dqkv + std::int64_t(b) * T * C3 + h * hs + 2 * C;
    const float* att = probs + (std::int64_t(b) * NH + h) * TT;
    float* datt = dprobs + (std::int64_t(b) * NH + h) * TT;
    const float* dy = dout + std::int64_t(b) * T * C + h * hs;
    // dP = dout v^T; dv += P^T dout
    matmul(false, true, r1 - r0, r1, hs, 1.0f, dy + std::int64_t(r0) * C, C, v, C3, 0.0f,
           datt + std::int64_t(r0) * T, T);
    matmul(true, false, r1, hs, r1 - r0, 1.0f, att + std::int64_t(r0) * T, T, dy + std::int64_t(r0) * C, C, 1.0f, dv,
           C3);
  });
  // dS = P (dP - sum_j dP_j P_j), zero above the diagonal.
  Kokkos::parallel_for(
      "strata::attention_softmax_backward", rows_policy(std::int64_t(B) * NH * T), KOKKOS_LAMBDA(const Member& m) {
        const std::int64_t r = m.league_rank();
        const int n = int(r % T) + 1;
        const float* p = probs + r * T;
        float* d = dprobs + r * T;
        const float dot = team_sum<float>(m, n, [&](int j) { return d[j] * p[j]; });
        m.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, T), [&](int j) { d[j] = j < n ? p[j] * (d[j] - dot) : 0.0f; });
      });
  for_each_head_block(B, NH, T, [&](int b, int h, int r0, int r1) {
    const float* q = qkv + std::int64_t(b) * T * C3 + h * hs;
    float* dq = dqkv + std::int64_t(b) * T * C3 + h * hs;
    const float* datt = dprobs + (std::int64_t(b) * NH + h) * TT;
    // dq += scale dS k ; dk += scale dS^T q
    matmul(false, false, r1 - r0, hs, r1, scale, datt + std::int64_t(r0) * T, T, q + C, C3, 1.0f,
           dq + std::int64_t(r0) * C3, C3);
    matmul(true, false, r1, hs, r1 - r0, scale, datt + std::int64_t(r0) * T, T, q + std::int64_t(r0) * C3, C3, 1.0f,
           dq + C, C3);
  });
}

namespace {

// Keys of the block query i may attend: 0 .. visible - 1 (causal on global positions).
KOKKOS_INLINE_FUNCTION int visible_keys(int i, int Tk, int q0, int k0) {
  const int n = q0 + i - k0 + 1;
  return n < 0 ? 0 : n > Tk ? Tk : n;
}

// The dot product of two rows of hs floats, over the team.
KOKKOS_INLINE_FUNCTION float team_dot(const Member& m, const float* a, const float* b, int hs) {
  return team_sum<float>(m, hs, [&](int d) { return a[d] * b[d]; });
}

}  // namespace

void attention_block_forward(float* out, float* lse, const float* q, const float* kv, int B, int Tq, int Tk, int C,
                             int NH, std::int64_t q_batch, std::int64_t kv_batch, int q0, int k0, bool accumulate) {
  const int hs = C / NH;
  const std::int64_t C3 = 3 * std::int64_t(C), C2 = 2 * std::int64_t(C);
  const float scale = 1.0f / std::sqrt(float(hs));
  Kokkos::parallel_for(
      "strata::attention_block_forward", rows_policy(std::int64_t(B) * NH * Tq), KOKKOS_LAMBDA(const Member& m) {
        const float ninf = -Kokkos::Experimental::infinity<float>::value;
        const std::int64_t r = m.league_rank();
        const int i = int(r % Tq), h = int(r / Tq % NH), b = int(r / Tq / NH);
        const float* qi = q + (b * q_batch + i) * C3 + h * hs;
        const float* k = kv + b * kv_batch * C2 + h * hs;
        float* y = out + (b * q_batch + i) * C + h * hs;
        float& li = lse[(std::int64_t(b) * NH + h) * q_batch + i];
        const int n = visible_keys(i, Tk, q0, k0);
        if (n == 0) {  // no key of the block: out 0 and lse -inf, or unchanged
          if (!accumulate) {
            Kokkos::parallel_for(Kokkos::TeamThreadRange(m, hs), [&](int d) { y[d] = 0.0f; });
            Kokkos::single(Kokkos::PerTeam(m), [&] { li = ninf; });
          }
          return;
        }
        float mx = ninf;
        for (int j = 0; j < n; ++j) {
          const float s = scale * team_dot(m, qi, k + j * C2, hs);
          mx = s > mx ? s : mx;
        }
        float sum = 0;
        for (int j = 0; j < n; ++j) sum += exp_vec(scale * team_dot(m, qi, k + j * C2, hs) - mx);
        const float lb = mx + kmath::log(sum);
        // out' = out a + sum_j e^(s_j - L) v_j: L the block's lse (a = 0) or,
        // merging into a row that attended earlier blocks, the merged one.
        const float prev = li;
        float L = lb, a = 0.0f;
        if (accumulate && prev != ninf) {
          const float top = prev > lb ? prev : lb;
          L = top + kmath::log(kmath::exp(prev - top) + kmath::exp(lb - top));
          a = kmath::exp(prev - L);
        }
        m.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, hs), [&](int d) { y[d] = a == 0.0f ? 0.0f : y[d] * a; });
        for (int j = 0; j < n; ++j) {
          const float p = exp_vec(scale * team_dot(m, qi, k + j * C2, hs) - L);
          const float* vj = k + j * C2 + C;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, hs), [&](int d) { y[d] += p * vj[d]; });
        }
        Kokkos::single(Kokkos::PerTeam(m), [&] { li = L; });
      });
}

void attention_block_backward(float* dq, float* dkv, const float* dout, const float* q, const float* kv,
                              const float* out, const float* lse, int B, int Tq, int Tk, int C, int NH,
                              std::int64_t q_batch, std::int64_t kv_batch, int q0, int k0) {
  const int hs = C / NH;
  const std::int64_t C3 = 3 * std::int64_t(C), C2 = 2 * std::int64_t(C);
  const float scale = 1.0f / std::sqrt(float(hs));
  // dS_ij = P_ij (dout_i . v_j - D_i), P_ij = e^(s_ij - lse_i), D_i = dout_i . out_i
  // (the softmax backward's row term over every block, which out carries).
  // dq_i += scale sum_j dS_ij k_j: a team per query row.
  Kokkos::parallel_for(
      "strata::attention_block_backward_dq", rows_policy(std::int64_t(B) * NH * Tq), KOKKOS_LAMBDA(const Member& m) {
        const std::int64_t r = m.league_rank();
        const int i = int(r % Tq), h = int(r / Tq % NH), b = int(r / Tq / NH);
        const std::int64_t row = b * q_batch + i;
        const float* qi = q + row * C3 + h * hs;
        const float* dyi = dout + row * C + h * hs;
        const float* k = kv + b * kv_batch * C2 + h * hs;
        float* dqi = dq + row * C3 + h * hs;
        const float li = lse[(std::int64_t(b) * NH + h) * q_batch + i];
        const float D = team_dot(m, dyi, out + row * C + h * hs, hs);
        const int n = visible_keys(i, Tk, q0, k0);
        for (int j = 0; j < n; ++j) {
          const float* kj = k + j * C2;
          const float p = exp_vec(scale * team_dot(m, qi, kj, hs) - li);
          const float ds = p * (team_dot(m, dyi, kj + C, hs) - D);
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, hs), [&](int d) { dqi[d] += scale * ds * kj[d]; });
        }
      });
  // dk_j += scale sum_i dS_ij q_i and dv_j += sum_i P_ij dout_i: a team per
  // key row, over the queries that see it.
  Kokkos::parallel_for(
      "strata::attention_block_backward_dkv", rows_policy(std::int64_t(B) * NH * Tk), KOKKOS_LAMBDA(const Member& m) {
        const std::int64_t r = m.league_rank();
        const int j = int(r % Tk), h = int(r / Tk % NH), b = int(r / Tk / NH);
        const float* kj = kv + (b * kv_batch + j) * C2 + h * hs;
        float* dkj = dkv + (b * kv_batch + j) * C2 + h * hs;
        const int first = k0 + j - q0 > 0 ? k0 + j - q0 : 0;
        for (int i = first; i < Tq; ++i) {
          const std::int64_t row = b * q_batch + i;
          const float* qi = q + row * C3 + h * hs;
          const float* dyi = dout + row * C + h * hs;
          const float li = lse[(std::int64_t(b) * NH + h) * q_batch + i];
          const float p = exp_vec(scale * team_dot(m, qi, kj, hs) - li);
          const float ds = p * (team_dot(m, dyi, kj + C, hs) - team_dot(m, dyi, out + row * C + h * hs, hs));
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, hs), [&](int d) {
            dkj[d] += scale * ds * qi[d];
            dkj[C + d] += p * dyi[d];
          });
        }
      });
}

}  // namespace strata::kernels::kokkos
