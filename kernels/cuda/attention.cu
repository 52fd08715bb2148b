// Fused causal multi-head or grouped-query attention, FlashAttention-2
// style, on the CUDA cores (fp32 and fp16 tensors) or on tensor cores (bf16
// tensors, below): the T x T scores of a head exist only tile by tile, in registers
// and shared memory, never in global memory.
//
// Grouped-query attention (kernels/ops.inc). NH query heads share NKV
// key-value heads, a group of G = NH / NKV query heads per key-value head:
// query head h reads key-value head h / G. A qkv row is C + 2 KVC elements
// (KVC = NKV hs): q in its first C, then k, then v. The forward pass is per
// query head and simply reads its group's k and v (G query heads read the
// same key rows, from L2 after the first). The backward pass is per
// key-value head: a block owns a key tile of key-value head g and walks the
// query tiles of every query head of g's group in turn, so that dk and dv,
// which sum over all G heads, accumulate in the block's registers for the
// whole walk and are added to dqkv once, without atomics (each key row of
// each key-value head still belongs to exactly one block). dq is per query
// head and added with atomicAdd (Formats, below, says where). NKV = NH (G = 1) is multi-head
// attention: the same blocks, the same arithmetic, the same results as
// before grouping. The price of the per-group walk is parallelism: the
// backward has B NKV key tiles' blocks instead of B NH, each G times longer.
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
// Forward (one kernel): a block per (64 query rows, query head); q is loaded
// once (pre-scaled), then the key tiles 0 .. the diagonal one of the group's
// key-value head are streamed through shared memory (k, then v in the same
// buffer). For each, online softmax: the row maximum m and the sum l of
// exp(s - m) are updated and the output accumulator rescaled by
// exp(m_old - m_new) before adding P v. At the end out = acc / l is written
// (not accumulated) and state = m + log l, the row's log-sum-exp, is saved for
// the backward. Every key tile a row visits starts at or before the row, so it
// holds an unmasked key: m is finite from the first tile on and no -inf - -inf
// appears. Blocks are launched longest first (the last query tile sees the most
// keys).
//
// Backward (two kernels): first D_i = sum_d dout[i,d] out[i,d] per query-head
// row into `scratch` (one warp per row). Then a block per (64 keys, key-value
// head), with its k and v tiles in shared memory and dk, dv accumulating in
// registers, walks the query tiles from the diagonal to the end, for each query
// head of the group in turn; for each tile it recomputes P = exp(s - lse)
// (the forward's exact arithmetic, so P is the forward's), dP = dO v^T,
// dS = P (dP - D), then dv += P^T dO, dk += dS^T (q scale), and writes dS
// to shared memory so that the block can form dq = scale dS k for the query
// tile and add it to global memory with atomicAdd (other key tiles add to the
// same rows). dk and dv are added (+=) once, at the end: each key row (of a
// key-value head) belongs to one block.
//
// Memory traffic per head: the forward reads q once and k, v about T / 128
// times each (once per query tile that sees them, mostly from L2; G times
// under grouping), writes out and T floats of lse; the backward reads k, v
// once per key-value head and q, dO, lse, D about T / 128 times, adds dq in
// 64 x hs atomics per (key tile, query tile) pair, and dk, dv once. Against
// the unfused form, T x T probabilities are neither written nor read (4 MB
// per head at T = 1024).
//
// Shared memory per block, floats: forward 2 hs 65 (33 KB at hs = 64, 66 KB at
// 128); backward 4 hs 65 + 64 80 + 128 (87 KB at hs = 64, 150 KB at 128).
// Most are above the default 48 KB, so every launch opts in
// (cudaFuncSetAttribute). Head sizes 1 to 128; any T >= 1. Head sizes 129
// to 256 (Megatron-LM's 530 B and 1 T models have 160, Gemma's 256) run on
// ring attention's warp-per-row kernels instead
// (attention_forward_wide, ring_attention.cu): the whole sequence as one
// block, exact in fp32, on CUDA cores, without tiles in shared memory: a
// 64-query tile of hs 256 would need 266 KB of it in this backward, past
// an SM's 227 KB.
//
// Tensor cores. For bf16 tensors whose head size is a multiple of 16, the
// same two operations run on tensor cores instead: the attention products
// are as many FLOPs as a layer's GEMMs, and on CUDA cores they would cost more
// than all of them. Same contract, same tiles of 64 queries by 64 keys, same
// block order and masking; what changes is the arithmetic of the products.
// q, k, v and dO are staged to shared memory as they are (bf16); P and dS
// (produced) are rounded to bf16 (round to nearest even) as they are written
// there, and every product is a 16x16x16 WMMA (nvcuda::wmma) with
// fp32 accumulation. Everything else is fp32: the scale (applied to S after
// the product, not folded into bf16 q), the softmax statistics, the rescaling
// and the accumulation of O, dQ, dK and dV. Fragment elements are never
// indexed (their layout is the hardware's): products are stored to shared
// memory, ordinary threads do the softmax and dS arithmetic there, and the
// next product loads what it needs. A block is 4 warps (128 threads); warp w
// owns rows 16w .. 16w + 15 of the block's 64-row tile, so everything between
// two products of a warp is the warp's own business (__syncwarp), and the
// block synchronises only around the tiles that all warps read.
//
// Forward: a block per (64 query rows, query head). Q is staged once and kept
// in fragments; per key tile (0 .. the diagonal) K and V (of the group's
// key-value head) are staged, each warp forms its 16 x 64 S = Q K^T, two lanes
// per row run the online softmax on it (fp32 m, l in registers; P to bf16),
// rescale the row of the fp32 output accumulator O and the warp adds P V to it.
// O lives in shared memory, not in fragments, because the rescaling is per row
// and fragment elements are opaque. Then out = O / l, lse = m + log l.
//
// Backward: D = rowsum(dO o O) by the same row-dot kernel as the CUDA-core
// path (attention_row_dots); then a
// block per (64 keys, key-value head), warp w owning keys 16w .., walks the
// query tiles from the diagonal, for each query head of the group in turn. Per
// query tile: S^T = K Q^T and dP^T = V dO^T (16 x 64 per warp),
// P^T = exp(S^T scale - lse) and dS^T = P^T (dP^T - D) in fp32, rounded to bf16;
// dV += P^T dO and dK += dS^T Q in fp32 fragments held for the whole walk, over
// every head of the group (each key row belongs to one block: added to dqkv
// once, at the end, dK times the scale); after a block barrier (dQ needs every
// warp's keys) warp w forms rows 16w .. of dQ = dS K from dS^T read
// column-major, stores them to shared memory (over S^T and dP^T, consumed by
// then) and adds scale dQ to global memory with atomicAdd: other key tiles add
// to the same query rows.
//
// Shared memory, bytes, with rows padded (bf16 by 8, fp32 by 4 elements) so
// that a fragment's rows start on different banks:
//   forward  384 (hs + 8) + 256 (hs + 4) + 26880:
//            hs 16: 40.25 KiB, 32: 50.25, 64: 70.25, 128: 110.25
//            (3 blocks of an SM's 227 KiB at hs 64, 2 at 128);
//   backward 512 (hs + 8) + 53760:
//            hs 16: 64.5 KiB, 32: 72.5, 64: 88.5, 128: 120.5
//            (2 blocks at hs 64, 1 at 128).
// Registers hold the forward's Q fragments (hs / 16, 4 registers a lane
// each) and the backward's dK, dV accumulators (2 hs / 16 fragments of 8
// floats a lane: 128 registers at hs 128).
// Requires sm_80 or later (bf16 WMMA); the build targets sm_90.
//
// Formats. q, k, v, out and dout are in the call's format (E: fp32, bf16 or
// fp16), read as fp32 (the tensor-core kernels stage bf16 as it is) and
// written rounded once; lse and D are fp32. dq is summed over key tiles
// with atomics: into dqkv's query columns under fp32; a 2-byte format
// cannot take them, so under 16 bits into an fp32 accumulator in the
// scratch ([B, T, C] after D, as FlashAttention-2's dq_accum), added to
// dqkv once at the end. bf16
// runs on tensor cores (head sizes a multiple of 16 up to 128); fp32 and
// fp16 on CUDA cores.
#include <cuda_bf16.h>
#include <mma.h>

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
template <typename E>
__device__ void load_transposed(float* dst, const E* src, std::int64_t ld, int r0, int T, int hs, float mul) {
  for (int e = threadIdx.x; e < kTile * hs; e += kThreads) {
    const int i = e / hs, d = e % hs;
    dst[d * kStride + i] = r0 + i < T ? to_float(src[std::int64_t(r0 + i) * ld + d]) * mul : 0.0f;
  }
}

// kDpt: head dimensions per thread, hs <= 16 kDpt.
template <int kDpt, typename E>
__global__ void __launch_bounds__(kThreads, 2)
    attention_forward_kernel(E* out, float* lse, const E* qkv, int T, int C, int NH, int NKV, float scale) {
  extern __shared__ float smem[];
  const int hs = C / NH, kvc = NKV * hs;
  float* qt = smem;                // [hs][kStride]: q tile, scaled, transposed
  float* kv = smem + hs * kStride; // [hs][kStride]: k tile transposed, then [kTile][hs]: v tile
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16, half = (threadIdx.x % 32) & 16;
  const int qb = gridDim.x - 1 - blockIdx.x;  // longest first
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
  const std::int64_t ld = std::int64_t(C) + 2 * std::int64_t(kvc);
  const E* seq = qkv + std::int64_t(b) * T * ld;  // the sequence's qkv rows
  const E* q = seq + h * hs;
  const E* k = seq + C + kvh * hs;  // the group's key-value head
  const E* v = k + kvc;
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
      kv[e] = j0 + j < T ? to_float(v[std::int64_t(j0 + j) * ld + d]) : 0.0f;
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
    E* y = out + (std::int64_t(b) * T + i) * C + h * hs;
#pragma unroll
    for (int c = 0; c < kDpt; ++c)
      if (tx + 16 * c < hs) y[tx + 16 * c] = from_float<E>(acc[r][c] * inv);
    if (tx == 0) lse[std::int64_t(bh) * T + i] = m[r] + logf(l[r]);
  }
}

// D[b, h, t] = sum_d dout[b, t, h, d] out[b, t, h, d]: one warp per (b, t, h),
// consecutive warps on consecutive heads of a token (contiguous memory).
// dout in the call's format is what the products dP = dO V^T see, so that
// dP - D cancels where it should (in a row with a single key, out is v and
// dP - D is fp32 summation noise).
template <typename E>
__global__ void attention_row_dots(float* D, const E* dout, const E* out, int B, int T, int C, int NH) {
  const std::int64_t row = (std::int64_t(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= std::int64_t(B) * T * NH) return;  // whole warps leave together
  const int hs = C / NH;
  const int h = int(row % NH);
  const std::int64_t bt = row / NH;
  const E* dy = dout + bt * C + h * hs;
  const E* y = out + bt * C + h * hs;
  float acc = 0.0f;
  for (int d = lane; d < hs; d += 32) acc += to_float(dy[d]) * to_float(y[d]);
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(kFull, acc, o);
  if (lane == 0) {
    const std::int64_t b = bt / T, t = bt % T;
    D[(b * NH + h) * T + t] = acc;
  }
}

// dq_rows: fp32 rows ldq apart, the query columns' gradients summed over key
// tiles (dqkv itself under fp32, else the fp32 accumulator).
template <int kDpt, typename E>
__global__ void __launch_bounds__(kThreads, 1)
    attention_backward_kernel(E* dqkv, float* dq_rows, std::int64_t ldq, const E* dout, const E* qkv,
                              const float* lse, const float* D, int T, int C, int NH, int NKV, float scale) {
  extern __shared__ float smem[];
  const int hs = C / NH, kvc = NKV * hs;
  float* kt = smem;                       // [hs][kStride]: this block's k tile, transposed
  float* vt = kt + hs * kStride;          // [hs][kStride]: its v tile
  float* qt = vt + hs * kStride;          // [hs][kStride]: the current q tile, scaled
  float* dyt = qt + hs * kStride;         // [hs][kStride]: the current dO tile
  float* ds = dyt + hs * kStride;         // [kTile][kDsStride]: dS^T, keys x queries
  float* row_lse = ds + kTile * kDsStride;  // [kTile]
  float* row_d = row_lse + kTile;           // [kTile]
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16, half = (threadIdx.x % 32) & 16;
  const int kb = blockIdx.x;  // the first key tiles meet the most query tiles: launched first
  const int bg = blockIdx.y, b = bg / NKV, kvh = bg % NKV, group = NH / NKV;
  const std::int64_t ld = std::int64_t(C) + 2 * std::int64_t(kvc);
  const std::int64_t row0 = std::int64_t(b) * T * ld;  // the sequence's first qkv row
  const std::int64_t kcol = C + std::int64_t(kvh) * hs;  // key-value head kvh's k columns (v: kvc on)
  const int j0 = kb * kTile;
  const int nq = (T + kTile - 1) / kTile;

  load_transposed(kt, qkv + row0 + kcol, ld, j0, T, hs, 1.0f);
  load_transposed(vt, qkv + row0 + kcol + kvc, ld, j0, T, hs, 1.0f);

  // Rows ty + 16r of the key tile, head dimensions tx + 16c: summed over
  // every query head of the group.
  float dk[4][kDpt] = {}, dv[4][kDpt] = {};

  // The walk: for each query head of the group in turn, the query tiles
  // kb .. nq - 1.
  for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
    const std::int64_t bh = std::int64_t(b) * NH + h;
    const E* q = qkv + row0 + h * hs;
    const E* dy = dout + std::int64_t(b) * T * C + h * hs;
    float* dq = dq_rows + std::int64_t(b) * T * ldq + h * hs;
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
          if (tx + 16 * c < hs) atomicAdd(dq + std::int64_t(i) * ldq + tx + 16 * c, scale * g[r][c]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int j = j0 + ty + 16 * r;
    if (j >= T) continue;
    E* dkj = dqkv + row0 + std::int64_t(j) * ld + kcol;
    E* dvj = dkj + kvc;
#pragma unroll
    for (int c = 0; c < kDpt; ++c) {
      const int d = tx + 16 * c;
      if (d < hs) {
        dkj[d] = from_float<E>(to_float(dkj[d]) + dk[r][c]);
        dvj[d] = from_float<E>(to_float(dvj[d]) + dv[r][c]);
      }
    }
  }
}

// ---- tensor-core (bf16 WMMA) kernels ----

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;

constexpr int kTcWarps = 4;                 // warp w owns rows 16w .. 16w + 15 of a 64-row tile
constexpr int kTcThreads = 32 * kTcWarps;
// Row padding of the tiles in shared memory: WMMA wants ldm a multiple of 8
// (bf16) or 4 (fp32) elements, and 16 extra bytes per row put 8 consecutive
// rows (what one shared-memory access of a fragment load reads) on distinct
// banks.
constexpr int kBfPad = 8;
constexpr int kF32Pad = 4;
constexpr int kProbLd = kTile + kBfPad;     // of the bf16 [kTile][kTile] P and dS tiles
constexpr int kScoreLd = kTile + kF32Pad;   // of the fp32 [kTile][kTile] S and dP tiles

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;  // A read transposed
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;  // B read transposed
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Rows [r0, r0 + kTile) of one head's q, k, v or dO slice (row stride ld,
// kHs columns) into dst[row * ldd + d], rounded to bf16; rows at or past T as
// 0, so that the padded tile entries stay finite.
template <int kHs, typename E>
__device__ void stage_bf16(bf16* dst, int ldd, const E* src, std::int64_t ld, int r0, int T) {
  for (int e = threadIdx.x; e < kTile * kHs; e += kTcThreads) {
    const int i = e / kHs, d = e % kHs;
    dst[i * ldd + d] = __float2bfloat16(r0 + i < T ? to_float(src[std::int64_t(r0 + i) * ld + d]) : 0.0f);
  }
}

// kF = hs / 16: the fragments along a head dimension.
template <int kF, typename E>
__global__ void __launch_bounds__(kTcThreads)
    attention_forward_tc_kernel(E* out, float* lse, const E* qkv, int T, int C, int NH, int NKV, float scale) {
  constexpr int kHs = 16 * kF, kLdh = kHs + kBfPad, kLdo = kHs + kF32Pad;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  bf16* qs = reinterpret_cast<bf16*>(tc_smem);           // [kTile][kLdh]: the query tile
  bf16* ks = qs + kTile * kLdh;                          // [kTile][kLdh]: the key tile
  bf16* vs = ks + kTile * kLdh;                          // [kTile][kLdh]: the value tile
  bf16* ps = vs + kTile * kLdh;                          // [kTile][kProbLd]: P
  float* ss = reinterpret_cast<float*>(ps + kTile * kProbLd);  // [kTile][kScoreLd]: S, unscaled
  float* os = ss + kTile * kScoreLd;                     // [kTile][kLdo]: the output accumulator
  float* row_inv = os + kTile * kLdo;                    // [kTile]: 1 / l at the end
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int qb = gridDim.x - 1 - blockIdx.x;  // longest first
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
  const int kvc = NKV * kHs;
  const std::int64_t ld = std::int64_t(C) + 2 * std::int64_t(kvc);
  const E* seq = qkv + std::int64_t(b) * T * ld;  // the sequence's qkv rows
  const E* q = seq + h * kHs;
  const E* k = seq + C + kvh * kHs;  // the group's key-value head
  const E* v = k + kvc;
  const int i0 = qb * kTile;
  const int w0 = 16 * warp;  // the warp's first row of the tile

  stage_bf16<kHs>(qs, kLdh, q, ld, i0, T);
  for (int e = threadIdx.x; e < kTile * kLdo; e += kTcThreads) os[e] = 0.0f;
  __syncthreads();
  FragA qa[kF];  // the warp's 16 query rows, the same for every key tile
#pragma unroll
  for (int d = 0; d < kF; ++d) wmma::load_matrix_sync(qa[d], qs + w0 * kLdh + 16 * d, kLdh);

  // The softmax of row r = w0 + lane / 2 is run by two lanes, on alternate
  // columns; both hold its m and l.
  const int r = w0 + lane / 2, part = lane % 2;
  const int i = i0 + r;
  float m = -INFINITY, l = 0.0f;
  for (int kb = 0; kb <= qb; ++kb) {
    const int j0 = kb * kTile;
    __syncthreads();  // every warp is done with the previous k and v tiles
    stage_bf16<kHs>(ks, kLdh, k, ld, j0, T);
    stage_bf16<kHs>(vs, kLdh, v, ld, j0, T);
    __syncthreads();

    // S = Q K^T for the warp's rows: K^T is the key tile read column-major.
#pragma unroll
    for (int c = 0; c < kTile / 16; ++c) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int d = 0; d < kF; ++d) {
        FragBT kt;
        wmma::load_matrix_sync(kt, ks + 16 * c * kLdh + 16 * d, kLdh);
        wmma::mma_sync(acc, qa[d], kt, acc);
      }
      wmma::store_matrix_sync(ss + w0 * kScoreLd + 16 * c, acc, kScoreLd, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax (as the fp32 kernel's): P = exp(s - m_new) to bf16, the
    // row of O rescaled by exp(m_old - m_new). Key 0 of the tile is at or
    // before the row, so m is finite from the first tile on.
    const float* srow = ss + r * kScoreLd;
    float mx = -INFINITY;
    for (int c = part; c < kTile; c += 2)
      if (j0 + c <= i) mx = fmaxf(mx, srow[c] * scale);
    const float m_new = fmaxf(m, fmaxf(mx, __shfl_xor_sync(kFull, mx, 1)));
    const float corr = expf(m - m_new);  // 0 on the first tile (m = -inf)
    float sum = 0.0f;
    bf16* prow = ps + r * kProbLd;
    for (int c = part; c < kTile; c += 2) {
      const float p = j0 + c <= i ? expf(srow[c] * scale - m_new) : 0.0f;
      sum += p;
      prow[c] = __float2bfloat16(p);
    }
    l = l * corr + (sum + __shfl_xor_sync(kFull, sum, 1));  // the same in both lanes
    m = m_new;
    float* orow = os + r * kLdo;
    for (int d = part; d < kHs; d += 2) orow[d] *= corr;
    __syncwarp();

    // O += P V, through the accumulator in shared memory.
    FragA pa[kTile / 16];
#pragma unroll
    for (int c = 0; c < kTile / 16; ++c) wmma::load_matrix_sync(pa[c], ps + w0 * kProbLd + 16 * c, kProbLd);
#pragma unroll
    for (int d = 0; d < kF; ++d) {
      FragC acc;
      wmma::load_matrix_sync(acc, os + w0 * kLdo + 16 * d, kLdo, wmma::mem_row_major);
#pragma unroll
      for (int c = 0; c < kTile / 16; ++c) {
        FragB vb;
        wmma::load_matrix_sync(vb, vs + 16 * c * kLdh + 16 * d, kLdh);
        wmma::mma_sync(acc, pa[c], vb, acc);
      }
      wmma::store_matrix_sync(os + w0 * kLdo + 16 * d, acc, kLdo, wmma::mem_row_major);
    }
  }

  if (part == 0) {
    row_inv[r] = 1.0f / l;
    if (i < T) lse[std::int64_t(bh) * T + i] = m + logf(l);
  }
  __syncwarp();  // the warp's O rows and 1 / l are written
  for (int e = lane; e < 16 * kHs; e += 32) {
    const int rr = w0 + e / kHs, d = e % kHs;
    if (i0 + rr < T)
      out[(std::int64_t(b) * T + i0 + rr) * C + h * kHs + d] = from_float<E>(os[rr * kLdo + d] * row_inv[rr]);
  }
}

template <int kF, typename E>
__global__ void __launch_bounds__(kTcThreads)
    attention_backward_tc_kernel(E* dqkv, float* dq_acc, const E* dout, const E* qkv, const float* lse,
                                 const float* D, int T, int C, int NH, int NKV, float scale) {
  constexpr int kHs = 16 * kF, kLdh = kHs + kBfPad, kLdg = kHs + kF32Pad;
  // dQ's tile (and at the end dK's, dV's) goes over S^T and dP^T.
  static_assert(kTile * kLdg <= 2 * kTile * kScoreLd, "the dq tile must fit over S^T and dP^T");
  extern __shared__ __align__(128) unsigned char tc_smem[];
  bf16* ks = reinterpret_cast<bf16*>(tc_smem);              // [kTile][kLdh]: this block's keys
  bf16* vs = ks + kTile * kLdh;                             // [kTile][kLdh]: its values
  bf16* qs = vs + kTile * kLdh;                             // [kTile][kLdh]: the current query tile
  bf16* dys = qs + kTile * kLdh;                            // [kTile][kLdh]: its dO
  bf16* pts = dys + kTile * kLdh;                           // [kTile][kProbLd]: P^T, keys x queries
  bf16* dsts = pts + kTile * kProbLd;                       // [kTile][kProbLd]: dS^T
  float* sts = reinterpret_cast<float*>(dsts + kTile * kProbLd);  // [kTile][kScoreLd]: S^T, unscaled
  float* dpts = sts + kTile * kScoreLd;                     // [kTile][kScoreLd]: dP^T
  float* row_lse = dpts + kTile * kScoreLd;                 // [kTile]
  float* row_d = row_lse + kTile;                           // [kTile]
  float* gs = sts;  // [kTile][kLdg]: dQ rows, later dK and dV rows (warp w: rows 16w ..)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kb = blockIdx.x;  // the first key tiles meet the most query tiles: launched first
  const int bg = blockIdx.y, b = bg / NKV, kvh = bg % NKV, group = NH / NKV;
  const int kvc = NKV * kHs;
  const std::int64_t ld = std::int64_t(C) + 2 * std::int64_t(kvc);
  const std::int64_t row0 = std::int64_t(b) * T * ld;  // the sequence's first qkv row
  const std::int64_t kcol = C + std::int64_t(kvh) * kHs;  // key-value head kvh's k columns (v: kvc on)
  const int j0 = kb * kTile;
  const int nq = (T + kTile - 1) / kTile;
  const int w0 = 16 * warp;  // the warp's first key of the tile, and first query row of dQ

  stage_bf16<kHs>(ks, kLdh, qkv + row0 + kcol, ld, j0, T);
  stage_bf16<kHs>(vs, kLdh, qkv + row0 + kcol + kvc, ld, j0, T);

  FragC dk[kF], dv[kF];  // the warp's 16 keys x head dimensions, for the whole walk (every head of the group)
#pragma unroll
  for (int d = 0; d < kF; ++d) {
    wmma::fill_fragment(dk[d], 0.0f);
    wmma::fill_fragment(dv[d], 0.0f);
  }

  // The walk: for each query head of the group in turn, the query tiles
  // kb .. nq - 1.
  for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
    const std::int64_t bh = std::int64_t(b) * NH + h;
    const E* q = qkv + row0 + h * kHs;
    const E* dy = dout + std::int64_t(b) * T * C + h * kHs;
    float* dq = dq_acc + std::int64_t(b) * T * C + h * kHs;  // rows C apart
    for (int qb = kb; qb < nq; ++qb) {
      const int i0 = qb * kTile;
      // No barrier needed before restaging: every read of the previous query
      // tile's q, dO, lse and D (of this head or the previous one) came
      // before its dQ barrier below, which this warp has passed, and the
      // barrier after the staging keeps S^T (next) off the dq rows that other
      // warps may still be adding.
      stage_bf16<kHs>(qs, kLdh, q, ld, i0, T);
      stage_bf16<kHs>(dys, kLdh, dy, C, i0, T);
      if (threadIdx.x < kTile) {
        const int i = i0 + threadIdx.x;
        row_lse[threadIdx.x] = i < T ? lse[std::int64_t(bh) * T + i] : 0.0f;
        row_d[threadIdx.x] = i < T ? D[std::int64_t(bh) * T + i] : 0.0f;
      }
      __syncthreads();  // the tile (and, the first time, k and v) is staged; the previous dq rows are added

      // S^T = K Q^T and dP^T = V dO^T for the warp's keys (Q^T, dO^T: the
      // tiles read column-major).
#pragma unroll
      for (int c = 0; c < kTile / 16; ++c) {
        FragC st, dpt;
        wmma::fill_fragment(st, 0.0f);
        wmma::fill_fragment(dpt, 0.0f);
#pragma unroll
        for (int d = 0; d < kF; ++d) {
          FragA ka, va;
          FragBT qt, dyt;
          wmma::load_matrix_sync(ka, ks + w0 * kLdh + 16 * d, kLdh);
          wmma::load_matrix_sync(qt, qs + 16 * c * kLdh + 16 * d, kLdh);
          wmma::mma_sync(st, ka, qt, st);
          wmma::load_matrix_sync(va, vs + w0 * kLdh + 16 * d, kLdh);
          wmma::load_matrix_sync(dyt, dys + 16 * c * kLdh + 16 * d, kLdh);
          wmma::mma_sync(dpt, va, dyt, dpt);
        }
        wmma::store_matrix_sync(sts + w0 * kScoreLd + 16 * c, st, kScoreLd, wmma::mem_row_major);
        wmma::store_matrix_sync(dpts + w0 * kScoreLd + 16 * c, dpt, kScoreLd, wmma::mem_row_major);
      }
      __syncwarp();

      // P^T = exp(s scale - lse) (the forward's P), dS^T = P^T (dP^T - D), in
      // fp32, stored as bf16. Masked: above the diagonal, and the padding
      // queries past T (whose lse is a stand-in).
      for (int e = lane; e < 16 * kTile; e += 32) {
        const int r = w0 + e / kTile, c = e % kTile;
        const int j = j0 + r, i = i0 + c;
        const float p = (j <= i && i < T) ? expf(sts[r * kScoreLd + c] * scale - row_lse[c]) : 0.0f;
        pts[r * kProbLd + c] = __float2bfloat16(p);
        dsts[r * kProbLd + c] = __float2bfloat16(p * (dpts[r * kScoreLd + c] - row_d[c]));
      }
      __syncwarp();

      // dV += P^T dO, dK += dS^T Q over the tile's queries. Not unrolled: with
      // dK and dV live, unrolling let the compiler hoist loads past the 255
      // registers at hs 128 (spills), for no gain at the smaller head sizes.
#pragma unroll 1
      for (int c = 0; c < kTile / 16; ++c) {
        FragA pa, dsa;
        wmma::load_matrix_sync(pa, pts + w0 * kProbLd + 16 * c, kProbLd);
        wmma::load_matrix_sync(dsa, dsts + w0 * kProbLd + 16 * c, kProbLd);
#pragma unroll
        for (int d = 0; d < kF; ++d) {
          FragB yb, qb2;
          wmma::load_matrix_sync(yb, dys + 16 * c * kLdh + 16 * d, kLdh);
          wmma::mma_sync(dv[d], pa, yb, dv[d]);
          wmma::load_matrix_sync(qb2, qs + 16 * c * kLdh + 16 * d, kLdh);
          wmma::mma_sync(dk[d], dsa, qb2, dk[d]);
        }
      }
      __syncthreads();  // dQ's rows need every warp's keys of dS^T; S^T and dP^T are consumed

      // dQ = dS K for query rows w0 ..: dS is dS^T read column-major. Stored
      // over S^T and dP^T, then added (times the scale) to global memory.
      FragAT dsa[kTile / 16];
#pragma unroll
      for (int c = 0; c < kTile / 16; ++c) wmma::load_matrix_sync(dsa[c], dsts + 16 * c * kProbLd + w0, kProbLd);
#pragma unroll
      for (int d = 0; d < kF; ++d) {
        FragC g;
        wmma::fill_fragment(g, 0.0f);
#pragma unroll
        for (int c = 0; c < kTile / 16; ++c) {
          FragB kb2;
          wmma::load_matrix_sync(kb2, ks + 16 * c * kLdh + 16 * d, kLdh);
          wmma::mma_sync(g, dsa[c], kb2, g);
        }
        wmma::store_matrix_sync(gs + w0 * kLdg + 16 * d, g, kLdg, wmma::mem_row_major);
      }
      __syncwarp();
      for (int e = lane; e < 16 * kHs; e += 32) {
        const int r = w0 + e / kHs, d = e % kHs;
        if (i0 + r < T) atomicAdd(dq + std::int64_t(i0 + r) * C + d, scale * gs[r * kLdg + d]);
      }
    }
  }

  // dK and dV of the warp's keys, through its own rows of the dq buffer (no
  // other warp touches them any more: the last tile's barrier is passed).
  // Added, not atomically: each key row of key-value head kvh belongs to
  // this block, which summed every query head of the group into it.
  const auto add_rows = [&](const FragC (&acc)[kF], std::int64_t col, float mul) {
    __syncwarp();  // the rows' previous contents are read
#pragma unroll
    for (int d = 0; d < kF; ++d) wmma::store_matrix_sync(gs + w0 * kLdg + 16 * d, acc[d], kLdg, wmma::mem_row_major);
    __syncwarp();
    E* dst = dqkv + row0 + col;
    for (int e = lane; e < 16 * kHs; e += 32) {
      const int r = w0 + e / kHs, d = e % kHs;
      if (j0 + r < T) {
        E& x = dst[std::int64_t(j0 + r) * ld + d];
        x = from_float<E>(to_float(x) + mul * gs[r * kLdg + d]);
      }
    }
  };
  add_rows(dk, kcol, scale);
  add_rows(dv, kcol + kvc, 1.0f);
}

std::size_t forward_smem(int hs) { return sizeof(float) * 2 * hs * kStride; }
std::size_t backward_smem(int hs) { return sizeof(float) * (4 * hs * kStride + kTile * kDsStride + 2 * kTile); }
std::size_t forward_tc_smem(int hs) {
  return sizeof(bf16) * (3 * kTile * (hs + kBfPad) + kTile * kProbLd) +
         sizeof(float) * (kTile * kScoreLd + kTile * (hs + kF32Pad) + kTile);
}
std::size_t backward_tc_smem(int hs) {
  return sizeof(bf16) * (4 * kTile * (hs + kBfPad) + 2 * kTile * kProbLd) +
         sizeof(float) * (2 * kTile * kScoreLd + 2 * kTile);
}

// The tensor-core kernels (bf16 tensors only) run the head sizes they tile
// (hs / 16 = 1 .. 8).
static_assert(kMaxHeadSize == 16 * 8);
bool tensor_cores(int hs) { return hs % 16 == 0 && hs <= kMaxHeadSize; }

// The head size, checked against what the kernels handle, with the
// grouping (NKV divides NH) and B * NH against the grid's y dimension, which
// indexes the query heads (the backward's B * NKV is no more).
constexpr int kWideHeadSize = 256;  // attention_forward_wide's
int head_size(int B, int C, int NH, int NKV, const char* who) {
  if (NH <= 0 || C % NH != 0 || C / NH < 1 || C / NH > kWideHeadSize)
    throw std::invalid_argument(std::string(who) + ": head size C / NH = " + std::to_string(C) + " / " +
                                std::to_string(NH) + " must be a whole number in [1, " +
                                std::to_string(kWideHeadSize) + "] on the CUDA backend");
  if (NKV <= 0 || NH % NKV != 0)
    throw std::invalid_argument(std::string(who) + ": NKV = " + std::to_string(NKV) +
                                " key-value heads must be positive and divide NH = " + std::to_string(NH) +
                                " query heads");
  if (std::int64_t(B) * NH > 65535)
    throw std::invalid_argument(std::string(who) + ": B * NH = " + std::to_string(std::int64_t(B) * NH) +
                                " is above 65535 on the CUDA backend");
  return C / NH;
}

// Grids: the forward's y over (sequence, query head), the backward's over
// (sequence, key-value head); x over the 64-row tiles.
dim3 forward_grid(int B, int T, int NH) { return dim3((T + kTile - 1) / kTile, B * NH); }
dim3 backward_grid(int B, int T, int NKV) { return dim3((T + kTile - 1) / kTile, B * NKV); }

template <int kDpt, typename E>
void launch_forward(E* out, float* lse, const E* qkv, int B, int T, int C, int NH, int NKV, int hs) {
  const std::size_t smem = forward_smem(hs);
  STRATA_CHECK_CUDA(cudaFuncSetAttribute(attention_forward_kernel<kDpt, E>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  attention_forward_kernel<kDpt, E><<<forward_grid(B, T, NH), kThreads, smem>>>(out, lse, qkv, T, C, NH, NKV,
                                                                                1.0f / std::sqrt(float(hs)));
  STRATA_CHECK_LAUNCH();
}

template <int kDpt, typename E>
void launch_backward(E* dqkv, float* dq, std::int64_t ldq, const E* dout, const E* qkv, const float* lse,
                     const float* D, int B, int T, int C, int NH, int NKV, int hs) {
  const std::size_t smem = backward_smem(hs);
  STRATA_CHECK_CUDA(cudaFuncSetAttribute(attention_backward_kernel<kDpt, E>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  attention_backward_kernel<kDpt, E><<<backward_grid(B, T, NKV), kThreads, smem>>>(
      dqkv, dq, ldq, dout, qkv, lse, D, T, C, NH, NKV, 1.0f / std::sqrt(float(hs)));
  STRATA_CHECK_LAUNCH();
}

template <int kF, typename E>
void launch_forward_tc(E* out, float* lse, const E* qkv, int B, int T, int C, int NH, int NKV) {
  const std::size_t smem = forward_tc_smem(16 * kF);
  STRATA_CHECK_CUDA(cudaFuncSetAttribute(attention_forward_tc_kernel<kF, E>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  attention_forward_tc_kernel<kF, E><<<forward_grid(B, T, NH), kTcThreads, smem>>>(
      out, lse, qkv, T, C, NH, NKV, 1.0f / std::sqrt(float(16 * kF)));
  STRATA_CHECK_LAUNCH();
}

template <int kF, typename E>
void launch_backward_tc(E* dqkv, float* dq_acc, const E* dout, const E* qkv, const float* lse, const float* D, int B,
                        int T, int C, int NH, int NKV) {
  const std::size_t smem = backward_tc_smem(16 * kF);
  STRATA_CHECK_CUDA(cudaFuncSetAttribute(attention_backward_tc_kernel<kF, E>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  attention_backward_tc_kernel<kF, E><<<backward_grid(B, T, NKV), kTcThreads, smem>>>(
      dqkv, dq_acc, dout, qkv, lse, D, T, C, NH, NKV, 1.0f / std::sqrt(float(16 * kF)));
  STRATA_CHECK_LAUNCH();
}

// f(std::integral_constant<int, kF>) for hs = 16 kF, kF = 1 .. 8.
template <class F>
void with_fragments(int hs, F&& f) {
  switch (hs / 16) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}

// f(std::integral_constant<int, kDpt>): the head dimensions a thread of the
// CUDA-core kernels holds, hs <= 16 kDpt.
template <class F>
void with_dims_per_thread(int hs, F&& f) {
  if (hs <= 16) return f(std::integral_constant<int, 1>{});
  if (hs <= 32) return f(std::integral_constant<int, 2>{});
  if (hs <= 64) return f(std::integral_constant<int, 4>{});
  f(std::integral_constant<int, 8>{});
}

template <typename E>
void forward_(E* out, float* lse, const E* qkv, int B, int T, int C, int NH, int NKV, int hs) {
  if constexpr (std::is_same_v<E, core::Bf16>)
    if (tensor_cores(hs))
      return with_fragments(hs, [&](auto f) { launch_forward_tc<decltype(f)::value, E>(out, lse, qkv, B, T, C, NH, NKV); });
  with_dims_per_thread(hs, [&](auto d) { launch_forward<decltype(d)::value, E>(out, lse, qkv, B, T, C, NH, NKV, hs); });
}

template <typename E>
void backward_(E* dqkv, float* scratch, const E* dout, const E* qkv, const E* out, const float* lse, int B, int T,
               int C, int NH, int NKV, int hs) {
  // D per query head (dout and out are [B, T, C] whatever the grouping);
  // dq summed straight into dqkv's query columns under fp32, else into the
  // fp32 accumulator after D, zeroed, and added to dqkv once at the end.
  const std::int64_t rows = std::int64_t(B) * T * NH, tokens = std::int64_t(B) * T;
  const std::int64_t ld = C + 2 * std::int64_t(C / NH) * NKV;
  constexpr bool kWide = std::is_same_v<E, float>;
  float* D = scratch;
  float* dq = nullptr;
  std::int64_t ldq = C;
  if constexpr (kWide) {
    dq = dqkv, ldq = ld;
  } else {
    dq = scratch + rows;
    fill_zero(dq, tokens * C);
  }
  attention_row_dots<E><<<int((rows * 32 + kThreads - 1) / kThreads), kThreads>>>(D, dout, out, B, T, C, NH);
  STRATA_CHECK_LAUNCH();
  if constexpr (std::is_same_v<E, core::Bf16>) {
    if (tensor_cores(hs))
      with_fragments(hs, [&](auto f) {
        launch_backward_tc<decltype(f)::value, E>(dqkv, dq, dout, qkv, lse, D, B, T, C, NH, NKV);
      });
    else
      with_dims_per_thread(hs, [&](auto d) {
        launch_backward<decltype(d)::value, E>(dqkv, dq, ldq, dout, qkv, lse, D, B, T, C, NH, NKV, hs);
      });
  } else {
    with_dims_per_thread(hs, [&](auto d) {
      launch_backward<decltype(d)::value, E>(dqkv, dq, ldq, dout, qkv, lse, D, B, T, C, NH, NKV, hs);
    });
  }
  if constexpr (!kWide) copy_rows(dqkv, ld, dq, C, tokens, C, /*add=*/true);
}

// ---- the materialised scores' causal softmax (model.attention = "unfused") ----
// One block of kThreads per row: a row's reduction over the block, in every
// thread (fp32 partials through shared memory).
template <bool kMax>
__device__ float row_reduce(float v) {
  __shared__ float part[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int o = 16; o > 0; o /= 2) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, w) : v + w;
  }
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = part[0];
  for (int w = 1; w < warps; ++w) v = kMax ? fmaxf(v, part[w]) : v + part[w];
  __syncthreads();  // every thread has read the partials before a later call writes them
  return v;
}

template <typename E>
__global__ void causal_softmax_forward_kernel(E* p, int T) {
  const std::int64_t r = blockIdx.x;
  const int n = int(r % T) + 1;
  E* row = p + r * T;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, to_float(row[j]));
  m = row_reduce<true>(m);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) sum += expf(to_float(row[j]) - m);
  const float inv = 1.0f / row_reduce<false>(sum);
  for (int j = threadIdx.x; j < T; j += blockDim.x)
    row[j] = from_float<E>(j < n ? expf(to_float(row[j]) - m) * inv : 0.0f);
}

template <typename E>
__global__ void causal_softmax_backward_kernel(E* dp, const E* p, int T) {
  const std::int64_t r = blockIdx.x;
  const int n = int(r % T) + 1;
  E* d = dp + r * T;
  const E* x = p + r * T;
  float dot = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) dot += to_float(d[j]) * to_float(x[j]);
  dot = row_reduce<false>(dot);
  for (int j = threadIdx.x; j < T; j += blockDim.x)
    d[j] = from_float<E>(j < n ? to_float(x[j]) * (to_float(d[j]) - dot) : 0.0f);
}

template <typename E>
void causal_softmax_forward_(E* p, std::int64_t count, int T) {
  if (count * T <= 0) return;
  causal_softmax_forward_kernel<E><<<unsigned(count * T), kThreads>>>(p, T);
  STRATA_CHECK_LAUNCH();
}

template <typename E>
void causal_softmax_backward_(E* dp, const E* p, std::int64_t count, int T) {
  if (count * T <= 0) return;
  causal_softmax_backward_kernel<E><<<unsigned(count * T), kThreads>>>(dp, p, T);
  STRATA_CHECK_LAUNCH();
}

}  // namespace

void causal_softmax_forward(core::Ptr p, std::int64_t count, int T) {
  STRATA_BY_FORMAT(p, causal_softmax_forward_(p.as<E>(), count, T));
}

void causal_softmax_backward(core::Ptr dp, core::CPtr p, std::int64_t count, int T) {
  STRATA_BY_FORMAT(dp, causal_softmax_backward_(dp.as<E>(), p.as<E>(), count, T));
}

void attention_forward(core::Ptr out, core::Ptr state, core::CPtr qkv, int B, int T, int C, int NH, int NKV) {
  const int hs = head_size(B, C, NH, NKV, "attention_forward");
  if (B <= 0 || T <= 0) return;
  if (hs > kMaxHeadSize) return attention_forward_wide(out, state.f32(), qkv, B, T, C, NH, NKV);
  STRATA_BY_FORMAT(out, forward_(out.as<E>(), state.f32(), qkv.as<E>(), B, T, C, NH, NKV, hs));
}

void attention_backward(core::Ptr dqkv, core::Ptr scratch, core::CPtr dout, core::CPtr qkv, core::CPtr out,
                        core::CPtr state, int B, int T, int C, int NH, int NKV) {
  const int hs = head_size(B, C, NH, NKV, "attention_backward");
  if (B <= 0 || T <= 0) return;
  if (hs > kMaxHeadSize) return attention_backward_wide(dqkv, dout, qkv, out, state.f32(), B, T, C, NH, NKV);
  STRATA_BY_FORMAT(dqkv, backward_(dqkv.as<E>(), scratch.f32(), dout.as<E>(), qkv.as<E>(), out.as<E>(), state.f32(),
                                   B, T, C, NH, NKV, hs));
}

}  // namespace strata::kernels::cuda
