// LayerNorm forward: one block per row, the mean and then the squared
// deviations reduced over the block (two passes, as the CPU backend, so a
// large mean does not cancel the variance); rstd saved for the backward.
#include <cstdint>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"

namespace strata::kernels::cuda {

namespace {

constexpr int kThreads = 256;

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

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                         const float* bias, int C, float eps) {
  __shared__ float shared[kThreads / 32];
  const std::int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  float* y = out + row * C;
  float s = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += x[c];
  const float m = block_sum(s, shared) / C;
  float d = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) d += (x[c] - m) * (x[c] - m);
  const float r = 1.0f / sqrtf(block_sum(d, shared) / C + eps);
  for (int c = threadIdx.x; c < C; c += blockDim.x) y[c] = (x[c] - m) * r * weight[c] + bias[c];
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps) {
  if (N <= 0) return;
  layernorm_forward_kernel<<<N, kThreads>>>(out, mean, rstd, inp, weight, bias, C, eps);
  STRATA_CHECK_LAUNCH();
}

}  // namespace strata::kernels::cuda
