// Fused causal multi-head attention, FlashAttention-2 style, in fp32 on the
// CUDA cores: the T x T scores of a head exist only tile by tile, in registers
// and shared memory, never in global memory.
//
// Tiles. A block of 256 threads works on 64 x 64 tiles of the score matrix
// S = (q * scale) k^T. Thread (ty, tx) = (tid / 16, tid % 16) owns the 4 x 4
// entries at rows ty + 16r and columns tx + 16c (r, c < 4), and the same rows
// of the output tiles at head dimensions tx + 16c (c < kDpt = ceil(hs / 16)).
// The 16 threads of a row group are one half of a warp, so a row's reductions
// (max, sum) are 4 shuffles, and a thread's scores reach the others of its
// half-warp by shuffle when multiplied into V: P stays in registers. The
// tiles that a score's dot product runs along (q and k; in the backward also
// v and dO) sit in shared memory transposed, [hs][64 + 1], so that neither
// the transposing stores nor the reads of a column conflict on banks.
//
// Forward (one kernel): a block per (64 query rows, head); q is loaded once
// (pre-scaled), then the key tiles 0 .. the diagonal one are streamed through
// shared memory (k, then v in the same buffer). For each, online softmax:
// the row maximum m and the sum l of exp(s - m) are updated and the output
// accumulator rescaled by exp(m_old - m_new) before adding P v. At the end
// out = acc / l is written (not accumulated) and state = m + log l, the row's
// log-sum-exp, is saved for the backward. Every key tile a row visits starts
// at or before the row, so it holds an unmasked key: m is finite from the
// first tile on and no -inf - -inf appears. Blocks are launched longest first
// (the last query tile sees the most keys).
//
// Backward (two kernels): first D_i = sum_d dout[i,d] out[i,d] per head row
// into `scratch` (one warp per row). Then a block per (64 keys, head), with
// its k and v tiles in shared memory and dk, dv accumulating in registers,
// walks the query tiles from the diagonal to the end; for each it recomputes
// P = exp(s - lse) (the forward's exact arithmetic, so P is the forward's),
// dP = dO v^T, dS = P (dP - D), then dv += P^T dO, dk += dS^T (q scale), and
// writes dS to shared memory so that the block can form dq = scale dS k for
// the query tile and add it to global memory with atomicAdd (other key tiles
// add to the same rows). dk and dv are added (+=) once, at the end: each key
// row belongs to one block.
//
// Memory traffic per head: the forward reads q once and k, v about T / 128
// times each (once per query tile that sees them, mostly from L2), writes out
// and T floats of lse; the backward reads k, v once and q, dO, lse, D about
// T / 128 times, adds dq in 64 x hs atomics per (key tile, query tile) pair,
// and dk, dv once. Against the unfused form, T x T probabilities are neither
// written nor read (4 MB per head at T = 1024).
//
// Shared memory per block, floats: forward 2 hs 65 (33 KB at hs = 64, 66 KB at
// 128); backward 4 hs 65 + 64 80 + 128 (87 KB at hs = 64, 150 KB at 128).
// Most are above the default 48 KB, so every launch opts in
// (cudaFuncSetAttribute). Head sizes 1 to 128; any T >= 1.
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"

namespace strata::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kTile = 64;             // query rows and keys per tile
constexpr int kStride = kTile + 1;    // of the transposed [hs][kTile] tiles: odd, so columns don't conflict
constexpr int kDsStride = kTile + 16; // of the [kTile][kTile] dS tile: the two rows a warp writes land 16 banks apart
constexpr int kMaxHeadSize = 128;
constexpr unsigned kFull = 0xffffffffu;

// Max and sum over the 16 threads of a row group (a half-warp).
__device__ float half_warp_max(float v) {
  for (int o = 8; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}
__device__ float half_warp_sum(float v) {
  for (int o = 8; o > 0; o /= 2) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// rows [r0, r0 + kTile) of one head's q, k, v or dO slice (row stride ld),
// transposed into dst[d * kStride + row], times `mul`; rows at or past T read
// as 0 so that the padded tile entries stay finite.
__device__ void load_transposed(float* dst, const float* src, std::int64_t ld, int r0, int T, int hs, float mul) {
  for (int e = threadIdx.x; e < kTile * hs; e += kThreads) {
    const int i = e / hs, d = e % hs;
    dst[d * kStride + i] = r0 + i < T ? src[std::int64_t(r0 + i) * ld + d] * mul : 0.0f;
  }
}

// kDpt: head dimensions per thread, hs <= 16 kDpt.
template <int kDpt>
__global__ void __launch_bounds__(kThreads, 2)
    attention_forward_kernel(float* out, float* lse, const float* qkv, int T, int C, int NH, float scale) {
  extern __shared__ float smem[];
  const int hs = C / NH;
  float* qt = smem;                // [hs][kStride]: q tile, scaled, transposed
  float* kv = smem + hs * kStride; // [hs][kStride]: k tile transposed, then [kTile][hs]: v tile
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16, half = (threadIdx.x % 32) & 16;
  const int qb = gridDim.x - 1 - blockIdx.x;  // longest first
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const std::int64_t ld = 3 * std::int64_t(C);
  const float* q = qkv + std::int64_t(b) * T * ld + h * hs;
  const float* k = q + C;
  const float* v = q + 2 * C;
  const int i0 = qb * kTile;

  load_transposed(qt, q, ld, i0, T, hs, scale);

  float acc[4][kDpt] = {};
  float m[4], l[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) m[r] = -INFINITY, l[r] = 0.0f;

  for (int kb = 0; kb <= qb; ++kb) {
    const int j0 = kb * kTile;
    __syncthreads();  // the previous v tile (and, the first time, nothing) is read: k may overwrite it
    load_transposed(kv, k, ld, j0, T, hs, 1.0f);
    __syncthreads();

    float s[4][4] = {};
#pragma unroll 4
    for (int d = 0; d < hs; ++d) {
      float a[4], bk[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) a[r] = qt[d * kStride + ty + 16 * r];
#pragma unroll
      for (int c = 0; c < 4; ++c) bk[c] = kv[d * kStride + tx + 16 * c];
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) s[r][c] += a[r] * bk[c];
    }

    // Online softmax: s becomes exp(s - m_new), the accumulator is rescaled.
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = i0 + ty + 16 * r;
      float mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (j0 + tx + 16 * c > i) s[r][c] = -INFINITY;  // causal
        mx = fmaxf(mx, s[r][c]);
      }
      const float m_new = fmaxf(m[r], half_warp_max(mx));
      const float corr = expf(m[r] - m_new);
      float sum = 0.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        s[r][c] = expf(s[r][c] - m_new);
        sum += s[r][c];
      }
      l[r] = l[r] * corr + half_warp_sum(sum);
      m[r] = m_new;
#pragma unroll
      for (int c = 0; c < kDpt; ++c) acc[r][c] *= corr;
    }

    __syncthreads();  // k is read: v may overwrite it
    for (int e = threadIdx.x; e < kTile * hs; e += kThreads) {
      const int j = e / hs, d = e % hs;
      kv[e] = j0 + j < T ? v[std::int64_t(j0 + j) * ld + d] : 0.0f;
    }
    __syncthreads();

    // acc += P v, P's column j fetched from the thread of the half-warp that holds it.
#pragma unroll
    for (int jc = 0; jc < 4; ++jc) {
#pragma unroll 4
      for (int jj = 0; jj < 16; ++jj) {
        const int j = jc * 16 + jj;
        float p[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) p[r] = __shfl_sync(kFull, s[r][jc], half | jj);
#pragma unroll
        for (int c = 0; c < kDpt; ++c) {
          const int d = tx + 16 * c;
          if (d < hs) {
            const float vv = kv[j * hs + d];
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[r][c] += p[r] * vv;
          }
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int i = i0 + ty + 16 * r;
    if (i >= T) continue;
    const float inv = 1.0f / l[r];
    float* y = out + (std::int64_t(b) * T + i) * C + h * hs;
#pragma unroll
    for (int c = 0; c < kDpt; ++c)
      if (tx + 16 * c < hs) y[tx + 16 * c] = acc[r][c] * inv;
    if (tx == 0) lse[std::int64_t(bh) * T + i] = m[r] + logf(l[r]);
  }
}

// D[b, h, t] = sum_d dout[b, t, h, d] out[b, t, h, d]: one warp per (b, t, h),
// consecutive warps on consecutive heads of a token (contiguous memory).
__global__ void attention_row_dots(float* D, const float* dout, const float* out, int B, int T, int C, int NH) {
  const std::int64_t row = (std::int64_t(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= std::int64_t(B) * T * NH) return;  // whole warps leave together
  const int hs = C / NH;
  const int h = int(row % NH);
  const std::int64_t bt = row / NH;
  const float* dy = dout + bt * C + h * hs;
  const float* y = out + bt * C + h * hs;
  float acc = 0.0f;
  for (int d = lane; d < hs; d += 32) acc += dy[d] * y[d];
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(kFull, acc, o);
  if (lane == 0) {
    const std::int64_t b = bt / T, t = bt % T;
    D[(b * NH + h) * T + t] = acc;
  }
}

template <int kDpt>
__global__ void __launch_bounds__(kThreads, 1)
    attention_backward_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* D,
                              int T, int C, int NH, float scale) {
  extern __shared__ float smem[];
  const int hs = C / NH;
  float* kt = smem;                       // [hs][kStride]: this block's k tile, transposed
  float* vt = kt + hs * kStride;          // [hs][kStride]: its v tile
  float* qt = vt + hs * kStride;          // [hs][kStride]: the current q tile, scaled
  float* dyt = qt + hs * kStride;         // [hs][kStride]: the current dO tile
  float* ds = dyt + hs * kStride;         // [kTile][kDsStride]: dS^T, keys x queries
  float* row_lse = ds + kTile * kDsStride;  // [kTile]
  float* row_d = row_lse + kTile;           // [kTile]
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16, half = (threadIdx.x % 32) & 16;
  const int kb = blockIdx.x;  // the first key tiles meet the most query tiles: launched first
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const std::int64_t ld = 3 * std::int64_t(C);
  const std::int64_t head = std::int64_t(b) * T * ld + h * hs;
  const float* q = qkv + head;
  const float* dy = dout + std::int64_t(b) * T * C + h * hs;
  float* dq = dqkv + head;
  const int j0 = kb * kTile;
  const int nq = (T + kTile - 1) / kTile;

  load_transposed(kt, q + C, ld, j0, T, hs, 1.0f);
  load_transposed(vt, q + 2 * C, ld, j0, T, hs, 1.0f);

  // Rows ty + 16r of the key tile, head dimensions tx + 16c.
  float dk[4][kDpt] = {}, dv[4][kDpt] = {};

  for (int qb = kb; qb < nq; ++qb) {
    const int i0 = qb * kTile;
    __syncthreads();  // the previous query tile's q, dO and dS are read
    load_transposed(qt, q, ld, i0, T, hs, scale);
    load_transposed(dyt, dy, C, i0, T, hs, 1.0f);
    if (threadIdx.x < kTile) {
      const int i = i0 + threadIdx.x;
      row_lse[threadIdx.x] = i < T ? lse[std::int64_t(bh) * T + i] : 0.0f;
      row_d[threadIdx.x] = i < T ? D[std::int64_t(bh) * T + i] : 0.0f;
    }
    __syncthreads();

    // Transposed tiles, keys ty + 16r by queries tx + 16c: s^T then P^T, and
    // dP^T = v dO^T then dS^T.
    float p[4][4] = {}, dp[4][4] = {};
#pragma unroll 2
    for (int d = 0; d < hs; ++d) {
      float kr[4], vr[4], qc[4], oc[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) kr[r] = kt[d * kStride + ty + 16 * r], vr[r] = vt[d * kStride + ty + 16 * r];
#pragma unroll
      for (int c = 0; c < 4; ++c) qc[c] = qt[d * kStride + tx + 16 * c], oc[c] = dyt[d * kStride + tx + 16 * c];
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          p[r][c] += qc[c] * kr[r];  // the forward's order of operations: the same s, the same P
          dp[r][c] += vr[r] * oc[c];
        }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int j = j0 + ty + 16 * r, i = i0 + tx + 16 * c;
        // Masked: above the diagonal, and the padding rows past T (whose lse is a stand-in).
        p[r][c] = (j <= i && i < T) ? expf(p[r][c] - row_lse[tx + 16 * c]) : 0.0f;
        dp[r][c] = p[r][c] * (dp[r][c] - row_d[tx + 16 * c]);
      }

    // dv += P^T dO, dk += dS^T (q scale), over the tile's queries; P and dS
    // of query i come from the thread of the half-warp that holds them.
#pragma unroll
    for (int ic = 0; ic < 4; ++ic) {
#pragma unroll
      for (int ii = 0; ii < 16; ++ii) {
        const int i = ic * 16 + ii;
        float pr[4], dsr[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          pr[r] = __shfl_sync(kFull, p[r][ic], half | ii);
          dsr[r] = __shfl_sync(kFull, dp[r][ic], half | ii);
        }
#pragma unroll
        for (int c = 0; c < kDpt; ++c) {
          const int d = tx + 16 * c;
          if (d < hs) {
            const float o = dyt[d * kStride + i], qq = qt[d * kStride + i];
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              dv[r][c] += pr[r] * o;
              dk[r][c] += dsr[r] * qq;
            }
          }
        }
      }
    }

    // dq of the query tile = scale dS k: the sum runs over the keys, which
    // are spread over the block, so dS goes through shared memory.
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) ds[(ty + 16 * r) * kDsStride + tx + 16 * c] = dp[r][c];
    __syncthreads();
    float g[4][kDpt] = {};  // query rows ty + 16r, head dimensions tx + 16c
#pragma unroll 4
    for (int j = 0; j < kTile; ++j) {
      float a[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) a[r] = ds[j * kDsStride + ty + 16 * r];
#pragma unroll
      for (int c = 0; c < kDpt; ++c) {
        const int d = tx + 16 * c;
        if (d < hs) {
          const float kk = kt[d * kStride + j];
#pragma unroll
          for (int r = 0; r < 4; ++r) g[r][c] += a[r] * kk;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = i0 + ty + 16 * r;
      if (i >= T) continue;
#pragma unroll
      for (int c = 0; c < kDpt; ++c)
        if (tx + 16 * c < hs) atomicAdd(dq + std::int64_t(i) * ld + tx + 16 * c, scale * g[r][c]);
    }
  }

#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int j = j0 + ty + 16 * r;
    if (j >= T) continue;
    float* dkj = dq + std::int64_t(j) * ld + C;
    float* dvj = dkj + C;
#pragma unroll
    for (int c = 0; c < kDpt; ++c) {
      const int d = tx + 16 * c;
      if (d < hs) {
        dkj[d] += dk[r][c];
        dvj[d] += dv[r][c];
      }
    }
  }
}

std::size_t forward_smem(int hs) { return sizeof(float) * 2 * hs * kStride; }
std::size_t backward_smem(int hs) { return sizeof(float) * (4 * hs * kStride + kTile * kDsStride + 2 * kTile); }

// The head size, checked against what the kernels handle (and B * NH against
// the grid's y dimension, which indexes the heads).
int head_size(int B, int C, int NH, const char* who) {
  if (NH <= 0 || C % NH != 0 || C / NH < 1 || C / NH > kMaxHeadSize)
    throw std::invalid_argument(std::string(who) + ": head size C / NH = " + std::to_string(C) + " / " +
                                std::to_string(NH) + " must be a whole number in [1, " +
                                std::to_string(kMaxHeadSize) + "] on the CUDA backend");
  if (std::int64_t(B) * NH > 65535)
    throw std::invalid_argument(std::string(who) + ": B * NH = " + std::to_string(std::int64_t(B) * NH) +
                                " is above 65535 on the CUDA backend");
  return C / NH;
}

template <int kDpt>
void launch_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH, int hs) {
  const std::size_t smem = forward_smem(hs);
  STRATA_CHECK_CUDA(cudaFuncSetAttribute(attention_forward_kernel<kDpt>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid((T + kTile - 1) / kTile, B * NH);
  attention_forward_kernel<kDpt><<<grid, kThreads, smem>>>(out, lse, qkv, T, C, NH, 1.0f / std::sqrt(float(hs)));
  STRATA_CHECK_LAUNCH();
}

template <int kDpt>
void launch_backward(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* D, int B,
                     int T, int C, int NH, int hs) {
  const std::size_t smem = backward_smem(hs);
  STRATA_CHECK_CUDA(cudaFuncSetAttribute(attention_backward_kernel<kDpt>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid((T + kTile - 1) / kTile, B * NH);
  attention_backward_kernel<kDpt>
      <<<grid, kThreads, smem>>>(dqkv, dout, qkv, lse, D, T, C, NH, 1.0f / std::sqrt(float(hs)));
  STRATA_CHECK_LAUNCH();
}

}  // namespace

void attention_forward(float* out, float* state, const float* qkv, int B, int T, int C, int NH) {
  const int hs = head_size(B, C, NH, "attention_forward");
  if (B <= 0 || T <= 0) return;
  if (hs <= 16)
    launch_forward<1>(out, state, qkv, B, T, C, NH, hs);
  else if (hs <= 32)
    launch_forward<2>(out, state, qkv, B, T, C, NH, hs);
  else if (hs <= 64)
    launch_forward<4>(out, state, qkv, B, T, C, NH, hs);
  else
    launch_forward<8>(out, state, qkv, B, T, C, NH, hs);
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* out,
                        const float* state, int B, int T, int C, int NH) {
  const int hs = head_size(B, C, NH, "attention_backward");
  if (B <= 0 || T <= 0) return;
  const std::int64_t rows = std::int64_t(B) * T * NH;
  attention_row_dots<<<int((rows * 32 + kThreads - 1) / kThreads), kThreads>>>(scratch, dout, out, B, T, C, NH);
  STRATA_CHECK_LAUNCH();
  if (hs <= 16)
    launch_backward<1>(dqkv, dout, qkv, state, scratch, B, T, C, NH, hs);
  else if (hs <= 32)
    launch_backward<2>(dqkv, dout, qkv, state, scratch, B, T, C, NH, hs);
  else if (hs <= 64)
    launch_backward<4>(dqkv, dout, qkv, state, scratch, B, T, C, NH, hs);
  else
    launch_backward<8>(dqkv, dout, qkv, state, scratch, B, T, C, NH, hs);
}

}  // namespace strata::kernels::cuda
