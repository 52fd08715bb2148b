// Fused softmax cross-entropy, one block per row of V logits: the row's
// maximum, then the sum of exponentials (float per thread, the threads'
// partials added in double, as the CPU backend's blocks are), then the loss;
// the backward writes (softmax - onehot) * dloss over the logits in place,
// every element read before the block writes any.
#include <cstdint>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"

namespace strata::kernels::cuda {

namespace {

constexpr int kThreads = 256;

struct RowStats {
  float max;
  double sum;  // sum of exp(x - max)
};

__device__ RowStats row_stats(const float* x, int V) {
  __shared__ float smax[kThreads / 32];
  __shared__ double ssum[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, x[i]);
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) smax[warp] = m;
  __syncthreads();
  m = smax[0];
  for (int w = 1; w < warps; ++w) m = fmaxf(m, smax[w]);
  float part = 0.0f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) part += expf(x[i] - m);
  double s = part;
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) ssum[warp] = s;
  __syncthreads();
  s = 0;
  for (int w = 0; w < warps; ++w) s += ssum[w];
  __syncthreads();  // every thread has read the shared partials before any write
  return {m, s};
}

__global__ void ce_forward(float* losses, const float* logits, const std::int32_t* targets, int V) {
  const std::int64_t row = blockIdx.x;
  const float* x = logits + row * V;
  const RowStats st = row_stats(x, V);
  if (threadIdx.x == 0) losses[row] = float(double(st.max) + log(st.sum) - double(x[targets[row]]));
}

__global__ void ce_backward(float* dlogits, const float* logits, const std::int32_t* targets, float dloss, int V) {
  const std::int64_t row = blockIdx.x;
  const float* x = logits + row * V;
  float* dx = dlogits + row * V;
  const RowStats st = row_stats(x, V);
  const float scale = float(double(dloss) / st.sum);
  const int target = targets[row];
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float p = expf(x[i] - st.max) * scale;  // read, then write the same element
    dx[i] = i == target ? p - dloss : p;
  }
}

}  // namespace

void softmax_cross_entropy_forward(float* losses, const float* logits, const std::int32_t* targets, int N, int V) {
  if (N <= 0) return;
  ce_forward<<<N, kThreads>>>(losses, logits, targets, V);
  STRATA_CHECK_LAUNCH();
}

void softmax_cross_entropy_backward(float* dlogits, const float* logits, const std::int32_t* targets, float dloss,
                                    int N, int V) {
  if (N <= 0) return;
  ce_backward<<<N, kThreads>>>(dlogits, logits, targets, dloss, V);
  STRATA_CHECK_LAUNCH();
}

}  // namespace strata::kernels::cuda
