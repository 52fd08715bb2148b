// Causal self-attention, multi-head or grouped-query (NKV key-value heads,
// each read by NH / NKV query heads), with the CPU backend's algorithm and
// state: per (batch, head), S = q k^T scaled through KokkosBlas (row blocks
// of 64 that skip the upper triangle), a causal softmax kernel in place (a
// team per row), and P v into the head's columns of out; the backward pass
// runs the same products transposed around a softmax-backward kernel.
//
// Ring attention's blocks (context parallelism) keep no T x T scores: a team
// per query row recomputes each score from q and k where it needs it (the
// forward's max, sum and output passes), and the backward runs one kernel
// per query row (dq) and one per key row of a key-value head (dk, dv, summed
// over the query heads that read it), so that every gradient element has one
// writer and needs no atomics.
//
// Formats. The probabilities (the state) and their gradient are in the
// call's format, and so are the scores and dP, which the products write
// there before the softmax reads them: under 16 bits they are rounded there
// once, as an unfused 16-bit attention (Megatron-LM's) rounds them; the
// softmax and its backward compute in fp32. The ring blocks accumulate each
// row's output and gradients in fp32 team scratch and round them once.
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/kokkos/kokkos_kernels.hpp"
#include "kernels/kokkos/views.hpp"
#include "kernels/vec_math.hpp"

namespace strata::kernels::kokkos {

namespace {

constexpr int kRowBlock = 64;

// Rows [r0, r1) of every (b, h): S = scale q k^T for keys [0, r1), or the
// backward's products; `each` is called with the head's pointers. The
// products are launched one after another from the host and run in that
// order on the execution space, so the query heads of a group, which all
// accumulate into their key-value head's dk and dv (beta 1), take turns:
// no two products write one element at once.
template <class F>
void for_each_head_block(int B, int NH, int T, F&& each) {
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int r0 = 0; r0 < T; r0 += kRowBlock) each(b, h, r0, r0 + kRowBlock < T ? r0 + kRowBlock : T);
}

// The layout of a qkv buffer: rows of C query columns, then KVC key and KVC
// value columns; query head h reads key-value head h / group.
struct QkvLayout {
  int C, hs, kvc, group, ld;
  QkvLayout(int C_, int NH, int NKV)
      : C(C_), hs(C_ / NH), kvc(NKV * (C_ / NH)), group(NH / NKV), ld(C_ + 2 * NKV * (C_ / NH)) {}
  // Column offsets within a row of head h's query, key and value.
  int q(int h) const { return h * hs; }
  int k(int h) const { return C + h / group * hs; }
  int v(int h) const { return C + kvc + h / group * hs; }
};

}  // namespace

// A team's fp32 scratch of n floats (level 0).
using Scratch = Kokkos::View<float*, Exec::scratch_memory_space, Unmanaged>;
inline Team scratch_rows_policy(std::int64_t rows, int floats) {
  return rows_policy(rows).set_scratch_size(0, Kokkos::PerTeam(Scratch::shmem_size(floats)));
}

// Row t of each of `count` T x T matrices: the softmax of its first t + 1
// scores, zeros after (a team per row).
template <typename E>
void causal_softmax_forward_(E* probs, std::int64_t count, int T) {
  Kokkos::parallel_for(
      "strata::causal_softmax_forward", rows_policy(count * T), KOKKOS_LAMBDA(const Member& m) {
        const std::int64_t r = m.league_rank();
        const int t = int(r % T), n = t + 1;
        E* row = probs + r * T;
        const float mx = team_max(m, row, n);
        // fp32: the exponentials stored as they are summed, then scaled (one
        // exp a score); a 16-bit row takes them again from the scores, so
        // that its probabilities are rounded once.
        constexpr bool kStore = std::is_same_v<E, float>;
        const float sum = team_sum<float>(m, n, [&](int j) {
          const float e = exp_vec(to_float(row[j]) - mx);
          if constexpr (kStore) row[j] = e;
          return e;
        });
        m.team_barrier();
        const float inv = 1.0f / sum;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, T), [&](int j) {
          const float e = kStore ? to_float(row[j]) : exp_vec(to_float(row[j]) - mx);
          row[j] = from_float<E>(j < n ? e * inv : 0.0f);
        });
      });
}

// dS = P (dP - sum_j dP_j P_j) in dP's place, zero above the diagonal.
template <typename E>
void causal_softmax_backward_(E* dprobs, const E* probs, std::int64_t count, int T) {
  Kokkos::parallel_for(
      "strata::causal_softmax_backward", rows_policy(count * T), KOKKOS_LAMBDA(const Member& m) {
        const std::int64_t r = m.league_rank();
        const int n = int(r % T) + 1;
        const E* p = probs + r * T;
        E* d = dprobs + r * T;
        const float dot = team_sum<float>(m, n, [&](int j) { return to_float(d[j]) * to_float(p[j]); });
        m.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, T), [&](int j) {
          d[j] = from_float<E>(j < n ? to_float(p[j]) * (to_float(d[j]) - dot) : 0.0f);
        });
      });
}

template <typename E>
void attention_forward_(E* out, E* probs, const E* qkv, int B, int T, int C, int NH, int NKV) {
  const QkvLayout L(C, NH, NKV);
  const int hs = L.hs, ld = L.ld;
  const float scale = 1.0f / std::sqrt(float(hs));
  const std::int64_t TT = std::int64_t(T) * T;
  for_each_head_block(B, NH, T, [&](int b, int h, int r0, int r1) {
    const E* row0 = qkv + std::int64_t(b) * T * ld;
    E* att = probs + (std::int64_t(b) * NH + h) * TT;
    matmul(false, true, r1 - r0, r1, hs, scale, row0 + std::int64_t(r0) * ld + L.q(h), ld, row0 + L.k(h), ld,
           0.0f, att + std::int64_t(r0) * T, T);
  });
  causal_softmax_forward_(probs, std::int64_t(B) * NH, T);
  for_each_head_block(B, NH, T, [&](int b, int h, int r0, int r1) {
    const E* v = qkv + std::int64_t(b) * T * ld + L.v(h);
    const E* att = probs + (std::int64_t(b) * NH + h) * TT;
    E* y = out + std::int64_t(b) * T * C + h * hs;
    matmul(false, false, r1 - r0, hs, r1, 1.0f, att + std::int64_t(r0) * T, T, v, ld, 0.0f,
           y + std::int64_t(r0) * C, C);
  });
}

template <typename E>
void attention_backward_(E* dqkv, E* dprobs, const E* dout, const E* qkv, const E* probs, int B, int T, int C, int NH,
                         int NKV) {
  const QkvLayout L(C, NH, NKV);
  const int hs = L.hs, ld = L.ld;
  const float scale = 1.0f / std::sqrt(float(hs));
  const std::int64_t TT = std::int64_t(T) * T;
  // Head by head (for_each_head_block: one product at a time), so a
  // key-value head's dk and dv take its query heads' sums in turn.
  for_each_head_block(B, NH, T, [&](int b, int h, int r0, int r1) {
    const E* v = qkv + std::int64_t(b) * T * ld + L.v(h);
    E* dv = dqkv + std::int64_t(b) * T * ld + L.v(h);
    const E* att = probs + (std::int64_t(b) * NH + h) * TT;
    E* datt = dprobs + (std::int64_t(b) * NH + h) * TT;
    const E* dy = dout + std::int64_t(b) * T * C + h * hs;
    // dP = dout v^T; dv += P^T dout
    matmul(false, true, r1 - r0, r1, hs, 1.0f, dy + std::int64_t(r0) * C, C, v, ld, 0.0f,
           datt + std::int64_t(r0) * T, T);
    matmul(true, false, r1, hs, r1 - r0, 1.0f, att + std::int64_t(r0) * T, T, dy + std::int64_t(r0) * C, C, 1.0f, dv,
           ld);
  });
  causal_softmax_backward_(dprobs, probs, std::int64_t(B) * NH, T);  // dS, in place
  for_each_head_block(B, NH, T, [&](int b, int h, int r0, int r1) {
    const E* row0 = qkv + std::int64_t(b) * T * ld;
    E* drow0 = dqkv + std::int64_t(b) * T * ld;
    const E* datt = dprobs + (std::int64_t(b) * NH + h) * TT;
    // dq += scale dS k ; dk += scale dS^T q
    matmul(false, false, r1 - r0, hs, r1, scale, datt + std::int64_t(r0) * T, T, row0 + L.k(h), ld, 1.0f,
           drow0 + std::int64_t(r0) * ld + L.q(h), ld);
    matmul(true, false, r1, hs, r1 - r0, scale, datt + std::int64_t(r0) * T, T, row0 + std::int64_t(r0) * ld + L.q(h),
           ld, 1.0f, drow0 + L.k(h), ld);
  });
}

namespace {

// Keys of the block query i may attend: 0 .. visible - 1 (causal on global positions).
KOKKOS_INLINE_FUNCTION int visible_keys(int i, int Tk, int q0, int k0) {
  const int n = q0 + i - k0 + 1;
  return n < 0 ? 0 : n > Tk ? Tk : n;
}

// The dot product of two rows of hs elements, over the team.
template <typename A, typename B>
KOKKOS_INLINE_FUNCTION float team_dot(const Member& m, const A* a, const B* b, int hs) {
  return team_sum<float>(m, hs, [&](int d) { return to_float(a[d]) * to_float(b[d]); });
}

template <typename E>
void block_forward_(E* out, float* lse, const E* q, const E* kv, int B, int Tq, int Tk, int C, int NH, int NKV,
                    std::int64_t q_batch, std::int64_t kv_batch, int q0, int k0, bool accumulate) {
  const int hs = C / NH, group = NH / NKV;
  // q rows are qkv rows (C + 2 KVC wide); kv rows hold KVC keys, then KVC values.
  const std::int64_t KVC = std::int64_t(NKV) * hs, QW = C + 2 * KVC, KW = 2 * KVC;
  const float scale = 1.0f / std::sqrt(float(hs));
  Kokkos::parallel_for(
      "strata::attention_block_forward", scratch_rows_policy(std::int64_t(B) * NH * Tq, hs),
      KOKKOS_LAMBDA(const Member& m) {
        const float ninf = -Kokkos::Experimental::infinity<float>::value;
        const std::int64_t r = m.league_rank();
        const int i = int(r % Tq), h = int(r / Tq % NH), b = int(r / Tq / NH);
        const E* qi = q + (b * q_batch + i) * QW + h * hs;
        const E* k = kv + b * kv_batch * KW + (h / group) * hs;
        E* y = out + (b * q_batch + i) * C + h * hs;
        const Scratch acc(m.team_scratch(0), hs);  // the row's output, fp32
        float& li = lse[(std::int64_t(b) * NH + h) * q_batch + i];
        const int n = visible_keys(i, Tk, q0, k0);
        if (n == 0) {  // no key of the block: out 0 and lse -inf, or unchanged
          if (!accumulate) {
            Kokkos::parallel_for(Kokkos::TeamThreadRange(m, hs), [&](int d) { y[d] = from_float<E>(0.0f); });
            Kokkos::single(Kokkos::PerTeam(m), [&] { li = ninf; });
          }
          return;
        }
        float mx = ninf;
        for (int j = 0; j < n; ++j) {
          const float s = scale * team_dot(m, qi, k + j * KW, hs);
          mx = s > mx ? s : mx;
        }
        float sum = 0;
        for (int j = 0; j < n; ++j) sum += exp_vec(scale * team_dot(m, qi, k + j * KW, hs) - mx);
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
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, hs),
                             [&](int d) { acc(d) = a == 0.0f ? 0.0f : to_float(y[d]) * a; });
        for (int j = 0; j < n; ++j) {
          const float p = exp_vec(scale * team_dot(m, qi, k + j * KW, hs) - L);
          const E* vj = k + j * KW + KVC;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, hs), [&](int d) { acc(d) += p * to_float(vj[d]); });
        }
        m.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, hs), [&](int d) { y[d] = from_float<E>(acc(d)); });
        Kokkos::single(Kokkos::PerTeam(m), [&] { li = L; });
      });
}

template <typename E, typename DQ, typename DKV>
void block_backward_(DQ* dq, DKV* dkv, const E* dout, const E* q, const E* kv, const E* out, const float* lse, int B,
                     int Tq, int Tk, int C, int NH, int NKV, std::int64_t q_batch, std::int64_t kv_batch, int q0,
                     int k0) {
  const int hs = C / NH, group = NH / NKV;
  const std::int64_t KVC = std::int64_t(NKV) * hs, QW = C + 2 * KVC, KW = 2 * KVC;
  const float scale = 1.0f / std::sqrt(float(hs));
  // dS_ij = P_ij (dout_i . v_j - D_i), P_ij = e^(s_ij - lse_i), D_i = dout_i . out_i
  // (the softmax backward's row term over every block, which out carries).
  // dq_i += scale sum_j dS_ij k_j: a team per query row of a query head,
  // which alone writes that row's head columns of dq.
  Kokkos::parallel_for(
      "strata::attention_block_backward_dq", scratch_rows_policy(std::int64_t(B) * NH * Tq, hs),
      KOKKOS_LAMBDA(const Member& m) {
        const std::int64_t r = m.league_rank();
        const int i = int(r % Tq), h = int(r / Tq % NH), b = int(r / Tq / NH);
        const std::int64_t row = b * q_batch + i;
        const E* qi = q + row * QW + h * hs;
        const E* dyi = dout + row * C + h * hs;
        const E* k = kv + b * kv_batch * KW + (h / group) * hs;
        DQ* dqi = dq + row * QW + h * hs;
        const Scratch acc(m.team_scratch(0), hs);  // the row's dq, fp32
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, hs), [&](int d) { acc(d) = to_float(dqi[d]); });
        const float li = lse[(std::int64_t(b) * NH + h) * q_batch + i];
        const float D = team_dot(m, dyi, out + row * C + h * hs, hs);
        const int n = visible_keys(i, Tk, q0, k0);
        for (int j = 0; j < n; ++j) {
          const E* kj = k + j * KW;
          const float p = exp_vec(scale * team_dot(m, qi, kj, hs) - li);
          const float ds = p * (team_dot(m, dyi, kj + KVC, hs) - D);
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, hs), [&](int d) { acc(d) += scale * ds * to_float(kj[d]); });
        }
        m.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, hs), [&](int d) { dqi[d] = from_float<DQ>(acc(d)); });
      });
  // dk_j += scale sum_{h, i} dS_ij q_i and dv_j += sum_{h, i} P_ij dout_i: a
  // team per key row of a key-value head g, over the group's query heads
  // (g group .. (g + 1) group - 1) and the queries that see the key. Every
  // query head that reads g adds to the same dk_j and dv_j, so they are
  // summed in the one team that owns the row rather than by a team per
  // query head (which would race, or need atomics).
  Kokkos::parallel_for(
      "strata::attention_block_backward_dkv", scratch_rows_policy(std::int64_t(B) * NKV * Tk, 2 * hs),
      KOKKOS_LAMBDA(const Member& m) {
        const std::int64_t r = m.league_rank();
        const int j = int(r % Tk), g = int(r / Tk % NKV), b = int(r / Tk / NKV);
        const E* kj = kv + (b * kv_batch + j) * KW + g * hs;
        DKV* dkj = dkv + (b * kv_batch + j) * KW + g * hs;
        const Scratch acc(m.team_scratch(0), 2 * hs);  // the row's dk, then dv, fp32
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, hs), [&](int d) {
          acc(d) = to_float(dkj[d]);
          acc(hs + d) = to_float(dkj[KVC + d]);
        });
        const int first = k0 + j - q0 > 0 ? k0 + j - q0 : 0;
        for (int h = g * group; h < (g + 1) * group; ++h)
          for (int i = first; i < Tq; ++i) {
            const std::int64_t row = b * q_batch + i;
            const E* qi = q + row * QW + h * hs;
            const E* dyi = dout + row * C + h * hs;
            const float li = lse[(std::int64_t(b) * NH + h) * q_batch + i];
            const float p = exp_vec(scale * team_dot(m, qi, kj, hs) - li);
            const float ds = p * (team_dot(m, dyi, kj + KVC, hs) - team_dot(m, dyi, out + row * C + h * hs, hs));
            Kokkos::parallel_for(Kokkos::TeamThreadRange(m, hs), [&](int d) {
              acc(d) += scale * ds * to_float(qi[d]);
              acc(hs + d) += p * to_float(dyi[d]);
            });
          }
        m.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, hs), [&](int d) {
          dkj[d] = from_float<DKV>(acc(d));
          dkj[KVC + d] = from_float<DKV>(acc(hs + d));
        });
      });
}

}  // namespace

void causal_softmax_forward(core::Ptr p, std::int64_t count, int T) {
  STRATA_BY_FORMAT(p, causal_softmax_forward_(p.as<E>(), count, T));
}

void causal_softmax_backward(core::Ptr dp, core::CPtr p, std::int64_t count, int T) {
  STRATA_BY_FORMAT(dp, causal_softmax_backward_(dp.as<E>(), p.as<E>(), count, T));
}

void attention_forward(core::Ptr out, core::Ptr probs, core::CPtr qkv, int B, int T, int C, int NH, int NKV) {
  STRATA_BY_FORMAT(out, attention_forward_(out.as<E>(), probs.as<E>(), qkv.as<E>(), B, T, C, NH, NKV));
}

void attention_backward(core::Ptr dqkv, core::Ptr scratch, core::CPtr dout, core::CPtr qkv, core::CPtr /*out*/,
                        core::CPtr probs, int B, int T, int C, int NH, int NKV) {
  STRATA_BY_FORMAT(dqkv, attention_backward_(dqkv.as<E>(), scratch.as<E>(), dout.as<E>(), qkv.as<E>(), probs.as<E>(),
                                             B, T, C, NH, NKV));
}

void attention_block_forward(core::Ptr out, float* lse, core::CPtr q, core::CPtr kv, int B, int Tq, int Tk, int C,
                             int NH, int NKV, std::int64_t q_batch, std::int64_t kv_batch, int q0, int k0,
                             bool accumulate) {
  STRATA_BY_FORMAT(out, block_forward_(out.as<E>(), lse, q.as<E>(), kv.as<E>(), B, Tq, Tk, C, NH, NKV, q_batch,
                                       kv_batch, q0, k0, accumulate));
}

void attention_block_backward(core::Ptr dq, core::Ptr dkv, core::CPtr dout, core::CPtr q, core::CPtr kv,
                              core::CPtr out, const float* lse, int B, int Tq, int Tk, int C, int NH, int NKV,
                              std::int64_t q_batch, std::int64_t kv_batch, int q0, int k0) {
  STRATA_BY_FORMAT(q, core::with_accumulator<E>(dq.precision(), [&](auto qt) {
    core::with_accumulator<E>(dkv.precision(), [&](auto kt) {
      block_backward_(dq.as<decltype(qt)>(), dkv.as<decltype(kt)>(), dout.as<E>(), q.as<E>(), kv.as<E>(), out.as<E>(),
                      lse, B, Tq, Tk, C, NH, NKV, q_batch, kv_batch, q0, k0);
    });
  }));
}

}  // namespace strata::kernels::kokkos
