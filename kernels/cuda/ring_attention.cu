// Ring attention's blocks (context parallelism) on the CUDA cores, in fp32
// arithmetic over elements of the call's format (E; dq and dkv may be fp32
// accumulators), each output element written once per call:
// a block of queries against a block of keys at global positions, merged
// into the running output and log-sum-exp (kernels/ops.inc states the
// contract). The plain form: one warp per (query row, head) in the forward
// pass and for dq, one warp per (key row, head) for dk and dv, each walking
// the other side's rows with an online softmax or the rebuilt
// probabilities; a lane holds head dimensions lane, lane + 32, ... in
// registers: 4 of them for head sizes up to 128, 8 up to 256 (each kernel
// is built for both, so the common sizes keep their registers). No tiles in
// shared memory: each key row is read once per
// query row (from L2 when it fits). The whole-sequence kernels of
// attention.cu remain the single-rank path.
//
// Grouped-query attention: NH query heads read NKV key-value heads, query
// head h the key-value head h / (NH / NKV); q rows are C + 2 KVC floats
// apart (KVC = NKV hs), kv rows 2 KVC (keys, then values). The forward and
// dq warps are per query head and read their group's keys and values. The
// dk, dv warps are per (key row, key-value head) and walk the queries of
// every query head of the group, summing in registers, so that each dkv
// entry has one writer (no atomics) and NKV = NH is the multi-head case.
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/launch.cuh"

namespace strata::kernels::cuda {

namespace {

constexpr int kWarps = 8;                 // warps per block
constexpr int kMaxDims = 8;               // head dimensions per lane: hs <= 256
constexpr unsigned kAll = 0xffffffffu;

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(kAll, v, o);
  return v;
}

// Keys of the block query i may attend: 0 .. visible - 1.
__device__ int visible_keys(int i, int Tk, int q0, int k0) { return max(0, min(Tk, q0 + i - k0 + 1)); }

// One warp per (b, h, i): the block's softmax over the visible keys with an
// online maximum, then merged into out and lse.
template <int kDims, typename E>
__global__ void block_forward(E* out, float* lse, const E* q, const E* kv, int B, int Tq, int Tk, int C,
                              int NH, int NKV, std::int64_t q_batch, std::int64_t kv_batch, std::int64_t ldkv, int q0,
                              int k0, bool accumulate, float scale) {
  const std::int64_t w = (std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32);
  const int lane = threadIdx.x % 32;
  if (w >= std::int64_t(B) * NH * Tq) return;  // whole warps leave together
  const int i = int(w % Tq), h = int((w / Tq) % NH), b = int(w / (std::int64_t(Tq) * NH));
  const int hs = C / NH, kvc = NKV * hs, kvh = h / (NH / NKV);
  const std::int64_t ldq = C + 2 * std::int64_t(kvc);
  const E* qr = q + (std::int64_t(b) * q_batch + i) * ldq + h * hs;
  const E* kb = kv + std::int64_t(b) * kv_batch * ldkv + kvh * hs;
  float qd[kDims], acc[kDims];
  for (int c = 0; c < kDims; ++c) {
    const int d = lane + 32 * c;
    qd[c] = d < hs ? to_float(qr[d]) * scale : 0.0f;
    acc[c] = 0.0f;
  }
  const int n = visible_keys(i, Tk, q0, k0);
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j < n; ++j) {
    const E* kr = kb + std::int64_t(j) * ldkv;
    float s = 0.0f;
    for (int c = 0; c < kDims; ++c) {
      const int d = lane + 32 * c;
      if (d < hs) s += qd[c] * to_float(kr[d]);
    }
    s = warp_sum(s);
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new), p = expf(s - m_new);
    l = l * corr + p;
    for (int c = 0; c < kDims; ++c) {
      const int d = lane + 32 * c;
      acc[c] = acc[c] * corr + (d < hs ? p * to_float(kr[kvc + d]) : 0.0f);
    }
    m = m_new;
  }
  E* y = out + (std::int64_t(b) * q_batch + i) * C + h * hs;
  float& li = lse[(std::int64_t(b) * NH + h) * q_batch + i];
  const float lb = n > 0 ? m + logf(l) : -INFINITY;
  const float old = li;  // every lane reads before lane 0 writes
  __syncwarp();
  if (!accumulate || old == -INFINITY) {
    for (int c = 0; c < kDims; ++c) {
      const int d = lane + 32 * c;
      if (d < hs) y[d] = from_float<E>(n > 0 ? acc[c] / l : 0.0f);
    }
    if (lane == 0) li = lb;
  } else if (n > 0) {
    const float mx = fmaxf(old, lb);
    const float merged = mx + logf(expf(old - mx) + expf(lb - mx));
    const float a = expf(old - merged), f = expf(lb - merged) / l;
    for (int c = 0; c < kDims; ++c) {
      const int d = lane + 32 * c;
      if (d < hs) y[d] = from_float<E>(to_float(y[d]) * a + acc[c] * f);
    }
    if (lane == 0) li = merged;
  }
}

// dq of one (b, h, i): sum over its visible keys of scale dS k, with
// P = exp(s - lse) and dS = P (dout . v - D), D = dout . out.
template <int kDims, typename E, typename DQ>
__global__ void block_backward_dq(DQ* dq, const E* dout, const E* q, const E* kv, const E* out,
                                  const float* lse, int B, int Tq, int Tk, int C, int NH, int NKV,
                                  std::int64_t q_batch, std::int64_t kv_batch, std::int64_t ldkv, int q0, int k0,
                                  float scale) {
  const std::int64_t w = (std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32);
  const int lane = threadIdx.x % 32;
  if (w >= std::int64_t(B) * NH * Tq) return;
  const int i = int(w % Tq), h = int((w / Tq) % NH), b = int(w / (std::int64_t(Tq) * NH));
  const int hs = C / NH, kvc = NKV * hs, kvh = h / (NH / NKV);
  const std::int64_t ldq = C + 2 * std::int64_t(kvc);
  const std::int64_t row = std::int64_t(b) * q_batch + i;
  const E* qr = q + row * ldq + h * hs;
  const E* kb = kv + std::int64_t(b) * kv_batch * ldkv + kvh * hs;
  const E* dy = dout + row * C + h * hs;
  const E* y = out + row * C + h * hs;
  float qd[kDims], od[kDims], g[kDims];
  float D = 0.0f;
  for (int c = 0; c < kDims; ++c) {
    const int d = lane + 32 * c;
    qd[c] = d < hs ? to_float(qr[d]) * scale : 0.0f;
    od[c] = d < hs ? to_float(dy[d]) : 0.0f;
    D += d < hs ? od[c] * to_float(y[d]) : 0.0f;
    g[c] = 0.0f;
  }
  D = warp_sum(D);
  const float li = lse[(std::int64_t(b) * NH + h) * q_batch + i];
  const int n = visible_keys(i, Tk, q0, k0);
  for (int j = 0; j < n; ++j) {
    const E* kr = kb + std::int64_t(j) * ldkv;
    float s = 0.0f, dp = 0.0f;
    for (int c = 0; c < kDims; ++c) {
      const int d = lane + 32 * c;
      if (d < hs) s += qd[c] * to_float(kr[d]), dp += od[c] * to_float(kr[kvc + d]);
    }
    s = warp_sum(s), dp = warp_sum(dp);
    const float ds = expf(s - li) * (dp - D);
    for (int c = 0; c < kDims; ++c) {
      const int d = lane + 32 * c;
      if (d < hs) g[c] += ds * to_float(kr[d]);
    }
  }
  DQ* dqr = dq + row * ldq + h * hs;
  for (int c = 0; c < kDims; ++c) {
    const int d = lane + 32 * c;
    if (d < hs) dqr[d] = from_float<DQ>(to_float(dqr[d]) + scale * g[c]);
  }
}

// dk and dv of one (b, key-value head kvh, key j): sums over the queries
// that see it, of every query head of kvh's group, so that the entry has one
// writer, this warp.
template <int kDims, typename E, typename DKV>
__global__ void block_backward_dkv(DKV* dkv, const E* dout, const E* q, const E* kv, const E* out,
                                   const float* lse, int B, int Tq, int Tk, int C, int NH, int NKV,
                                   std::int64_t q_batch, std::int64_t kv_batch, std::int64_t ldkv, int q0, int k0,
                                   float scale) {
  const std::int64_t w = (std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32);
  const int lane = threadIdx.x % 32;
  if (w >= std::int64_t(B) * NKV * Tk) return;
  const int j = int(w % Tk), kvh = int((w / Tk) % NKV), b = int(w / (std::int64_t(Tk) * NKV));
  const int hs = C / NH, kvc = NKV * hs, group = NH / NKV;
  const std::int64_t ldq = C + 2 * std::int64_t(kvc);
  const E* kr = kv + (std::int64_t(b) * kv_batch + j) * ldkv + kvh * hs;
  float kd[kDims], vd[kDims], gk[kDims], gv[kDims];
  for (int c = 0; c < kDims; ++c) {
    const int d = lane + 32 * c;
    kd[c] = d < hs ? to_float(kr[d]) : 0.0f;
    vd[c] = d < hs ? to_float(kr[kvc + d]) : 0.0f;
    gk[c] = gv[c] = 0.0f;
  }
  // The queries that see key j: k0 + j <= q0 + i, of each head of the group.
  const int first = max(0, k0 + j - q0);
  for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int i = first; i < Tq; ++i) {
      const std::int64_t row = std::int64_t(b) * q_batch + i;
      const E* qr = q + row * ldq + h * hs;
      const E* dy = dout + row * C + h * hs;
      const E* y = out + row * C + h * hs;
      float s = 0.0f, dp = 0.0f, D = 0.0f;
      for (int c = 0; c < kDims; ++c) {
        const int d = lane + 32 * c;
        if (d < hs) {
          const float yy = to_float(dy[d]);
          s += to_float(qr[d]) * scale * kd[c], dp += yy * vd[c], D += yy * to_float(y[d]);
        }
      }
      s = warp_sum(s), dp = warp_sum(dp), D = warp_sum(D);
      const float p = expf(s - lse[(std::int64_t(b) * NH + h) * q_batch + i]);
      const float ds = p * (dp - D);
      for (int c = 0; c < kDims; ++c) {
        const int d = lane + 32 * c;
        if (d < hs) gv[c] += p * to_float(dy[d]), gk[c] += ds * scale * to_float(qr[d]);
      }
    }
  }
  DKV* dk = dkv + (std::int64_t(b) * kv_batch + j) * ldkv + kvh * hs;
  for (int c = 0; c < kDims; ++c) {
    const int d = lane + 32 * c;
    if (d < hs) {
      dk[d] = from_float<DKV>(to_float(dk[d]) + gk[c]);
      dk[kvc + d] = from_float<DKV>(to_float(dk[kvc + d]) + gv[c]);
    }
  }
}

int warps_grid(std::int64_t warps) { return int((warps + kWarps - 1) / kWarps); }

// The head size (a lane holds up to kMaxDims of a head's dimensions) and the
// grouping (NKV divides NH), checked before anything runs.
void check_heads(int C, int NH, int NKV, const char* who) {
  if (NH <= 0 || C % NH != 0)
    throw std::invalid_argument(std::string(who) + ": C = " + std::to_string(C) + " is not a multiple of NH = " +
                                std::to_string(NH));
  if (NKV <= 0 || NH % NKV != 0)
    throw std::invalid_argument(std::string(who) + ": NKV = " + std::to_string(NKV) +
                                " key-value heads must be positive and divide NH = " + std::to_string(NH) +
                                " query heads");
  if (C / NH > 32 * kMaxDims)
    throw std::runtime_error(std::string(who) + ": head size " + std::to_string(C / NH) + " above " +
                             std::to_string(32 * kMaxDims));
}

// Calls f with std::integral_constant<int, D>: the head dimensions a lane
// holds, 4 up to head size 128 and 8 above, so the common sizes keep their
// registers.
template <class F>
void with_dims(int hs, F&& f) {
  if (hs <= 128)
    f(std::integral_constant<int, 4>{});
  else
    f(std::integral_constant<int, 8>{});
}

// The forward and backward over blocks whose key-value rows are `ldkv`
// elements apart (2 KVC in the ring's packed blocks, C + 2 KVC read in place
// from qkv).
template <typename E>
void block_forward_any(E* out, float* lse, const E* q, const E* kv, int B, int Tq, int Tk, int C, int NH, int NKV,
                       std::int64_t q_batch, std::int64_t kv_batch, std::int64_t ldkv, int q0, int k0,
                       bool accumulate) {
  const std::int64_t warps = std::int64_t(B) * NH * Tq;
  if (warps == 0) return;
  const float scale = 1.0f / std::sqrt(float(C / NH));
  with_dims(C / NH, [&](auto dims) {
    block_forward<decltype(dims)::value, E><<<warps_grid(warps), 32 * kWarps>>>(
        out, lse, q, kv, B, Tq, Tk, C, NH, NKV, q_batch, kv_batch, ldkv, q0, k0, accumulate, scale);
  });
  STRATA_CHECK_LAUNCH();
}

template <typename E, typename DQ, typename DKV>
void block_backward_any(DQ* dq, DKV* dkv, const E* dout, const E* q, const E* kv, const E* out, const float* lse,
                        int B, int Tq, int Tk, int C, int NH, int NKV, std::int64_t q_batch, std::int64_t kv_batch,
                        std::int64_t ldkv, int q0, int k0) {
  const float scale = 1.0f / std::sqrt(float(C / NH));
  // dq: a warp per (query row, query head); dk and dv: a warp per (key row,
  // key-value head), over the group's query heads.
  with_dims(C / NH, [&](auto dims) {
    constexpr int D = decltype(dims)::value;
    if (std::int64_t(B) * NH * Tq > 0) {
      block_backward_dq<D, E, DQ><<<warps_grid(std::int64_t(B) * NH * Tq), 32 * kWarps>>>(
          dq, dout, q, kv, out, lse, B, Tq, Tk, C, NH, NKV, q_batch, kv_batch, ldkv, q0, k0, scale);
      STRATA_CHECK_LAUNCH();
    }
    if (std::int64_t(B) * NKV * Tk > 0) {
      block_backward_dkv<D, E, DKV><<<warps_grid(std::int64_t(B) * NKV * Tk), 32 * kWarps>>>(
          dkv, dout, q, kv, out, lse, B, Tq, Tk, C, NH, NKV, q_batch, kv_batch, ldkv, q0, k0, scale);
      STRATA_CHECK_LAUNCH();
    }
  });
}

}  // namespace

void attention_block_forward(core::Ptr out, float* lse, core::CPtr q, core::CPtr kv, int B, int Tq, int Tk, int C,
                             int NH, int NKV, std::int64_t q_batch, std::int64_t kv_batch, int q0, int k0,
                             bool accumulate) {
  check_heads(C, NH, NKV, "attention_block_forward");
  STRATA_BY_FORMAT(out, block_forward_any(out.as<E>(), lse, q.as<E>(), kv.as<E>(), B, Tq, Tk, C, NH, NKV, q_batch,
                                          kv_batch, 2 * std::int64_t(C / NH) * NKV, q0, k0, accumulate));
}

void attention_block_backward(core::Ptr dq, core::Ptr dkv, core::CPtr dout, core::CPtr q, core::CPtr kv,
                              core::CPtr out, const float* lse, int B, int Tq, int Tk, int C, int NH, int NKV,
                              std::int64_t q_batch, std::int64_t kv_batch, int q0, int k0) {
  check_heads(C, NH, NKV, "attention_block_backward");
  STRATA_BY_FORMAT(q, core::with_accumulator<E>(dq.precision(), [&](auto qt) {
    core::with_accumulator<E>(dkv.precision(), [&](auto kt) {
      block_backward_any(dq.as<decltype(qt)>(), dkv.as<decltype(kt)>(), dout.as<E>(), q.as<E>(), kv.as<E>(),
                         out.as<E>(), lse, B, Tq, Tk, C, NH, NKV, q_batch, kv_batch, 2 * std::int64_t(C / NH) * NKV,
                         q0, k0);
    });
  }));
}

void attention_forward_wide(core::Ptr out, float* lse, core::CPtr qkv, int B, int T, int C, int NH, int NKV) {
  check_heads(C, NH, NKV, "attention_forward");
  const std::int64_t ld = C + 2 * std::int64_t(C / NH) * NKV;
  STRATA_BY_FORMAT(out, block_forward_any(out.as<E>(), lse, qkv.as<E>(), (qkv + C).as<E>(), B, T, T, C, NH, NKV, T,
                                          T, ld, 0, 0, false));
}

void attention_backward_wide(core::Ptr dqkv, core::CPtr dout, core::CPtr qkv, core::CPtr out, const float* lse, int B,
                             int T, int C, int NH, int NKV) {
  check_heads(C, NH, NKV, "attention_backward");
  const std::int64_t ld = C + 2 * std::int64_t(C / NH) * NKV;
  STRATA_BY_FORMAT(dqkv, block_backward_any(dqkv.as<E>(), (dqkv + C).as<E>(), dout.as<E>(), qkv.as<E>(),
                                            (qkv + C).as<E>(), out.as<E>(), lse, B, T, T, C, NH, NKV, T, T, ld, 0, 0));
}

}  // namespace strata::kernels::cuda
