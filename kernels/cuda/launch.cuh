// Launch helpers shared by the CUDA backend's kernels (internal to kernels/cuda).
#pragma once

#include <cstdint>

#include "kernels/cuda/check.hpp"

namespace strata::kernels::cuda {

inline constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements (capped: each thread loops).
inline int blocks_for(std::int64_t n) {
  const std::int64_t b = (n + kThreads - 1) / kThreads;
  return int(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

template <typename F>
__global__ void pointwise(std::int64_t n, F f) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    f(i);
}

// f(i) for i in [0, n), one thread per element (a device lambda).
template <typename F>
void launch(std::int64_t n, F f) {
  if (n <= 0) return;
  pointwise<<<blocks_for(n), kThreads>>>(n, f);
  STRATA_CHECK_LAUNCH();
}

// One device double for reductions whose result comes back to the host
// (sums of squares), allocated once per process instead of per call.
double* reduction_slot();

// Adds per-thread partial sums `acc` of a grid into *out (warp shuffles, one
// atomic per warp).
__device__ inline void add_to_slot(double* out, double acc) {
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x % 32 == 0) atomicAdd(out, acc);
}

}  // namespace strata::kernels::cuda
