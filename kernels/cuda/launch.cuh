// Launch helpers shared by the CUDA backend's kernels (internal to kernels/cuda).
#pragma once

#include <cstdint>

#include "kernels/cuda/check.hpp"
#include "kernels/foundation/ptr.hpp"

namespace strata::kernels::cuda {

// Elements of any format read as fp32 and written rounded once: host and
// device functions (kernels/foundation/ptr.hpp).
using core::from_float;
using core::to_float;

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

// Column sums over many rows (bias and norm-parameter gradients): a block
// covers kColumnTile adjacent columns (a warp reads them in one transaction)
// with kRowLanes lanes of rows, over one of up to kRowChunks chunks of the
// rows, so that thousands of blocks share the rows instead of one thread
// walking every row of its column. Each block sums its rows in double and
// adds its partial to the fp32 output with one atomic per column: the
// order of those few additions varies between runs.
inline constexpr int kColumnTile = 32, kRowLanes = 8, kRowChunks = 32;

inline dim3 column_grid(int N, int C) {
  const int chunks = N < kRowChunks * 64 ? (N + 63) / 64 : kRowChunks;
  return dim3((C + kColumnTile - 1) / kColumnTile, chunks > 0 ? chunks : 1);
}
inline dim3 column_block() { return dim3(kColumnTile, kRowLanes); }

// Rows [first, last) of this block's chunk of N rows.
__device__ inline void chunk_rows(int N, int* first, int* last) {
  const int per = (N + gridDim.y - 1) / gridDim.y;
  *first = blockIdx.y * per;
  *last = min(N, *first + per);
}

// The block's row lanes' partial sums of its columns, added to out[c].
__device__ inline void add_column_partial(float* out, int c, int C, double acc, double (*part)[kColumnTile]) {
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    double s = 0;
    for (int r = 0; r < kRowLanes; ++r) s += part[r][threadIdx.x];
    atomicAdd(out + c, float(s));
  }
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
