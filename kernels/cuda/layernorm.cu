// LayerNorm: the forward one block per row, the mean and then the squared
// deviations reduced over the block (two passes, as the CPU backend, so a
// large mean does not cancel the variance), rstd saved for the backward; the
// backward's input gradient one block per row, its parameter gradients one
// thread per column.
// RMSNorm likewise, without the mean and the bias: the forward one block per
// row (one pass: the mean square), the input gradient one block per row, the
// weight gradient column sums over the rows (launch.cuh's column blocks).
// Rows and weights in the call's format (E), read as fp32; outputs rounded
// once; statistics and parameter gradients fp32.
#include <cstdint>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/cuda_kernels.hpp"

namespace strata::kernels::cuda {

namespace {

// Sum over the block, in float, every thread getting the result.
__device__ float block_sum(float v, float* shared) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < int(blockDim.x) / 32; ++w) total += shared[w];
  __syncthreads();
  return total;
}

template <typename E>
__global__ void layernorm_forward_kernel(E* out, float* mean, float* rstd, const E* inp, const E* weight,
                                         const E* bias, int C, float eps) {
  __shared__ float shared[kThreads / 32];
  const std::int64_t row = blockIdx.x;
  const E* x = inp + row * C;
  E* y = out + row * C;
  float s = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += to_float(x[c]);
  const float m = block_sum(s, shared) / C;
  float d = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) d += (to_float(x[c]) - m) * (to_float(x[c]) - m);
  const float r = 1.0f / sqrtf(block_sum(d, shared) / C + eps);
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    y[c] = from_float<E>((to_float(x[c]) - m) * r * to_float(weight[c]) + to_float(bias[c]));
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// dinp, one block per row: dx += s (dnorm - mean(dnorm) - norm mean(dnorm norm)).
template <typename E>
__global__ void layernorm_backward_input(E* dinp, const E* dout, const E* inp, const E* weight, const float* mean,
                                         const float* rstd, int C) {
  __shared__ float shared[kThreads / 32];
  const std::int64_t row = blockIdx.x;
  const E* x = inp + row * C;
  const E* dy = dout + row * C;
  E* dx = dinp + row * C;
  const float m = mean[row], s = rstd[row];
  float a = 0.0f, b = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float norm = (to_float(x[c]) - m) * s, dnorm = to_float(dy[c]) * to_float(weight[c]);
    a += dnorm;
    b += dnorm * norm;
  }
  const float dnorm_mean = block_sum(a, shared) / C, dnorm_norm_mean = block_sum(b, shared) / C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float norm = (to_float(x[c]) - m) * s, dnorm = to_float(dy[c]) * to_float(weight[c]);
    dx[c] = from_float<E>(to_float(dx[c]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
  }
}

// dweight and dbias: column sums over the rows (launch.cuh's column blocks),
// in double over each block's rows.
template <typename E>
__global__ void layernorm_backward_params(float* dweight, float* dbias, const E* dout, const E* inp,
                                          const float* mean, const float* rstd, int N, int C) {
  __shared__ double part[kRowLanes][kColumnTile];
  const int c = blockIdx.x * kColumnTile + threadIdx.x;
  int first = 0, last = 0;
  chunk_rows(N, &first, &last);
  double dw = 0, db = 0;
  if (c < C)
    for (int n = first + int(threadIdx.y); n < last; n += kRowLanes) {
      const std::int64_t i = std::int64_t(n) * C + c;
      dw += double((to_float(inp[i]) - mean[n]) * rstd[n] * to_float(dout[i]));
      db += double(to_float(dout[i]));
    }
  add_column_partial(dweight, c, C, dw, part);
  __syncthreads();  // part is reused
  add_column_partial(dbias, c, C, db, part);
}

// RMSNorm forward, one block per row: rstd = 1 / sqrt(mean(x^2) + eps),
// out = x rstd weight (the CPU backend's arithmetic, the sum in float).
template <typename E>
__global__ void rmsnorm_forward_kernel(E* out, float* rstd, const E* inp, const E* weight, int C, float eps) {
  __shared__ float shared[kThreads / 32];
  const std::int64_t row = blockIdx.x;
  const E* x = inp + row * C;
  E* y = out + row * C;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) ss += to_float(x[c]) * to_float(x[c]);
  const float r = 1.0f / sqrtf(block_sum(ss, shared) / C + eps);
  for (int c = threadIdx.x; c < C; c += blockDim.x) y[c] = from_float<E>(to_float(x[c]) * r * to_float(weight[c]));
  if (threadIdx.x == 0) rstd[row] = r;
}

// RMSNorm's dinp, one block per row: with norm = x s and dnorm = dout weight,
// dx += s (dnorm - norm mean(dnorm norm)) (LayerNorm's without the mean terms).
template <typename E>
__global__ void rmsnorm_backward_input(E* dinp, const E* dout, const E* inp, const E* weight, const float* rstd,
                                       int C) {
  __shared__ float shared[kThreads / 32];
  const std::int64_t row = blockIdx.x;
  const E* x = inp + row * C;
  const E* dy = dout + row * C;
  E* dx = dinp + row * C;
  const float s = rstd[row];
  float a = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    a += to_float(dy[c]) * to_float(weight[c]) * to_float(x[c]) * s;
  const float dnorm_norm_mean = block_sum(a, shared) / C;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    dx[c] = from_float<E>(to_float(dx[c]) +
                          (to_float(dy[c]) * to_float(weight[c]) - to_float(x[c]) * s * dnorm_norm_mean) * s);
}

// RMSNorm's dweight: column sums of norm dout over the rows, in double over
// each block's rows (as layernorm_backward_params).
template <typename E>
__global__ void rmsnorm_backward_weight(float* dweight, const E* dout, const E* inp, const float* rstd, int N, int C) {
  __shared__ double part[kRowLanes][kColumnTile];
  const int c = blockIdx.x * kColumnTile + threadIdx.x;
  int first = 0, last = 0;
  chunk_rows(N, &first, &last);
  double dw = 0;
  if (c < C)
    for (int n = first + int(threadIdx.y); n < last; n += kRowLanes) {
      const std::int64_t i = std::int64_t(n) * C + c;
      dw += double(to_float(inp[i]) * rstd[n] * to_float(dout[i]));
    }
  add_column_partial(dweight, c, C, dw, part);
}

template <typename E>
void layernorm_backward_(E* dinp, float* dweight, float* dbias, const E* dout, const E* inp, const E* weight,
                         const float* mean, const float* rstd, int N, int C) {
  layernorm_backward_input<E><<<N, kThreads>>>(dinp, dout, inp, weight, mean, rstd, C);
  STRATA_CHECK_LAUNCH();
  layernorm_backward_params<E><<<column_grid(N, C), column_block()>>>(dweight, dbias, dout, inp, mean, rstd, N, C);
  STRATA_CHECK_LAUNCH();
}

template <typename E>
void layernorm_forward_(E* out, float* mean, float* rstd, const E* inp, const E* weight, const E* bias, int N, int C,
                        float eps) {
  layernorm_forward_kernel<E><<<N, kThreads>>>(out, mean, rstd, inp, weight, bias, C, eps);
  STRATA_CHECK_LAUNCH();
}

template <typename E>
void rmsnorm_forward_(E* out, float* rstd, const E* inp, const E* weight, int N, int C, float eps) {
  rmsnorm_forward_kernel<E><<<N, kThreads>>>(out, rstd, inp, weight, C, eps);
  STRATA_CHECK_LAUNCH();
}

template <typename E>
void rmsnorm_backward_(E* dinp, float* dweight, const E* dout, const E* inp, const E* weight, const float* rstd, int N,
                       int C) {
  rmsnorm_backward_input<E><<<N, kThreads>>>(dinp, dout, inp, weight, rstd, C);
  STRATA_CHECK_LAUNCH();
  rmsnorm_backward_weight<E><<<column_grid(N, C), column_block()>>>(dweight, dout, inp, rstd, N, C);
  STRATA_CHECK_LAUNCH();
}

}  // namespace

void layernorm_backward(core::Ptr dinp, float* dweight, float* dbias, core::CPtr dout, core::CPtr inp,
                        core::CPtr weight, const float* mean, const float* rstd, int N, int C) {
  if (N <= 0) return;
  STRATA_BY_FORMAT(dinp, layernorm_backward_(dinp.as<E>(), dweight, dbias, dout.as<E>(), inp.as<E>(), weight.as<E>(),
                                             mean, rstd, N, C));
}

void layernorm_forward(core::Ptr out, float* mean, float* rstd, core::CPtr inp, core::CPtr weight, core::CPtr bias,
                       int N, int C, float eps) {
  if (N <= 0) return;
  STRATA_BY_FORMAT(out, layernorm_forward_(out.as<E>(), mean, rstd, inp.as<E>(), weight.as<E>(), bias.as<E>(), N, C, eps));
}

void rmsnorm_forward(core::Ptr out, float* rstd, core::CPtr inp, core::CPtr weight, int N, int C, float eps) {
  if (N <= 0) return;
  STRATA_BY_FORMAT(out, rmsnorm_forward_(out.as<E>(), rstd, inp.as<E>(), weight.as<E>(), N, C, eps));
}

void rmsnorm_backward(core::Ptr dinp, float* dweight, core::CPtr dout, core::CPtr inp, core::CPtr weight,
                      const float* rstd, int N, int C) {
  if (N <= 0) return;
  STRATA_BY_FORMAT(dinp, rmsnorm_backward_(dinp.as<E>(), dweight, dout.as<E>(), inp.as<E>(), weight.as<E>(), rstd, N, C));
}

}  // namespace strata::kernels::cuda
