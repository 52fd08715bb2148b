// Fused softmax cross-entropy, one block per row of V logits: the row's
// maximum, then the sum of exponentials (float per thread, the threads'
// partials added in double, as the CPU backend's blocks are), then the loss;
// the backward writes (softmax - onehot) * dloss over the logits in place,
// every element read before the block writes any. The vocabulary-parallel
// pieces are the same block reductions taken one at a time, the row
// statistics coming from outside (combined over the ranks). Logits in the
// call's format (E), read as fp32; the gradient rounded once; row figures
// fp32.
#include <cstdint>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/launch.cuh"

namespace strata::kernels::cuda {

namespace {

// The row's maximum, in every thread of the block (launched with kThreads).
template <typename E>
__device__ float block_max(const E* x, int V) {
  __shared__ float smax[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, to_float(x[i]));
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) smax[warp] = m;
  __syncthreads();
  m = smax[0];
  for (int w = 1; w < warps; ++w) m = fmaxf(m, smax[w]);
  __syncthreads();  // every thread has read the shared partials before a later call writes them
  return m;
}

// sum_i exp(x[i] - m), in every thread of the block.
template <typename E>
__device__ double block_exp_sum(const E* x, float m, int V) {
  __shared__ double ssum[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  float part = 0.0f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) part += expf(to_float(x[i]) - m);
  double s = part;
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) ssum[warp] = s;
  __syncthreads();
  s = 0;
  for (int w = 0; w < warps; ++w) s += ssum[w];
  __syncthreads();  // every thread has read the shared partials before any write
  return s;
}

struct RowStats {
  float max;
  double sum;  // sum of exp(x - max)
};

template <typename E>
__device__ RowStats row_stats(const E* x, int V) {
  const float m = block_max(x, V);
  return {m, block_exp_sum(x, m, V)};
}

template <typename E>
__global__ void ce_forward(float* losses, const E* logits, const std::int32_t* targets, int V) {
  const std::int64_t row = blockIdx.x;
  const E* x = logits + row * V;
  const RowStats st = row_stats(x, V);
  if (threadIdx.x == 0) losses[row] = float(double(st.max) + log(st.sum) - double(to_float(x[targets[row]])));
}

template <typename E>
__global__ void ce_backward(E* dlogits, const E* logits, const std::int32_t* targets, float dloss, int V) {
  const std::int64_t row = blockIdx.x;
  const E* x = logits + row * V;
  E* dx = dlogits + row * V;
  const RowStats st = row_stats(x, V);
  const float scale = float(double(dloss) / st.sum);
  const int target = targets[row];
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float p = expf(to_float(x[i]) - st.max) * scale;  // read, then write the same element
    dx[i] = from_float<E>(i == target ? p - dloss : p);
  }
}

template <typename E>
__global__ void row_max_kernel(float* m, const E* logits, int V) {
  const std::int64_t row = blockIdx.x;
  const float r = block_max(logits + row * V, V);
  if (threadIdx.x == 0) m[row] = r;
}

template <typename E>
__global__ void row_exp_sum_kernel(float* s, const E* logits, const float* m, int V) {
  const std::int64_t row = blockIdx.x;
  const double r = block_exp_sum(logits + row * V, m[row], V);
  if (threadIdx.x == 0) s[row] = float(r);
}

// Each element is read and then written by the same thread, and the row
// statistics come from outside: dlogits may be logits.
template <typename E>
__global__ void ce_backward_sharded(E* dlogits, const E* logits, const float* m, const float* s,
                                    const std::int32_t* targets, int v_begin, float dloss, int V) {
  const std::int64_t row = blockIdx.x;
  const E* x = logits + row * V;
  E* dx = dlogits + row * V;
  const float mr = m[row];
  const float scale = float(double(dloss) / double(s[row]));
  const int target = targets[row] - v_begin;  // outside [0, V) when another rank holds it
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float p = expf(to_float(x[i]) - mr) * scale;
    dx[i] = from_float<E>(i == target ? p - dloss : p);
  }
}

// The launches, one block per row.
template <typename E>
void forward_(float* losses, const E* logits, const std::int32_t* targets, int N, int V) {
  ce_forward<E><<<N, kThreads>>>(losses, logits, targets, V);
  STRATA_CHECK_LAUNCH();
}
template <typename E>
void backward_(E* dlogits, const E* logits, const std::int32_t* targets, float dloss, int N, int V) {
  ce_backward<E><<<N, kThreads>>>(dlogits, logits, targets, dloss, V);
  STRATA_CHECK_LAUNCH();
}
template <typename E>
void row_max_(float* m, const E* logits, int N, int V) {
  row_max_kernel<E><<<N, kThreads>>>(m, logits, V);
  STRATA_CHECK_LAUNCH();
}
template <typename E>
void row_exp_sum_(float* s, const E* logits, const float* m, int N, int V) {
  row_exp_sum_kernel<E><<<N, kThreads>>>(s, logits, m, V);
  STRATA_CHECK_LAUNCH();
}
template <typename E>
void backward_sharded_(E* dlogits, const E* logits, const float* m, const float* s, const std::int32_t* targets,
                       int v_begin, float dloss, int N, int V) {
  ce_backward_sharded<E><<<N, kThreads>>>(dlogits, logits, m, s, targets, v_begin, dloss, V);
  STRATA_CHECK_LAUNCH();
}

template <typename E>
void pick_target_logits_(float* x, const E* logits, const std::int32_t* targets, int v_begin, int N, int V) {
  launch(N, [=] __device__(std::int64_t n) {
    const int t = targets[n] - v_begin;
    x[n] = (t >= 0 && t < V) ? to_float(logits[n * V + t]) : 0.0f;
  });
}

}  // namespace

void softmax_cross_entropy_forward(float* losses, core::CPtr logits, const std::int32_t* targets, int N, int V) {
  if (N <= 0) return;
  STRATA_BY_FORMAT(logits, forward_(losses, logits.as<E>(), targets, N, V));
}

void softmax_cross_entropy_backward(core::Ptr dlogits, core::CPtr logits, const std::int32_t* targets, float dloss,
                                    int N, int V) {
  if (N <= 0) return;
  STRATA_BY_FORMAT(dlogits, backward_(dlogits.as<E>(), logits.as<E>(), targets, dloss, N, V));
}

void row_max(float* m, core::CPtr logits, int N, int V) {
  if (N <= 0) return;
  STRATA_BY_FORMAT(logits, row_max_(m, logits.as<E>(), N, V));
}

void row_exp_sum(float* s, core::CPtr logits, const float* m, int N, int V) {
  if (N <= 0) return;
  STRATA_BY_FORMAT(logits, row_exp_sum_(s, logits.as<E>(), m, N, V));
}

void pick_target_logits(float* x, core::CPtr logits, const std::int32_t* targets, int v_begin, int N, int V) {
  STRATA_BY_FORMAT(logits, pick_target_logits_(x, logits.as<E>(), targets, v_begin, N, V));
}

void cross_entropy_from_parts(float* losses, const float* m, const float* s, const float* x, int N) {
  launch(N, [=] __device__(std::int64_t n) { losses[n] = float(double(m[n]) + log(double(s[n])) - double(x[n])); });
}

void softmax_cross_entropy_backward_sharded(core::Ptr dlogits, core::CPtr logits, const float* m, const float* s,
                                            const std::int32_t* targets, int v_begin, float dloss, int N, int V) {
  if (N <= 0) return;
  STRATA_BY_FORMAT(dlogits, backward_sharded_(dlogits.as<E>(), logits.as<E>(), m, s, targets, v_begin, dloss, N, V));
}

}  // namespace strata::kernels::cuda
