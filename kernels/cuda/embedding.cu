// Token + position embedding. Forward: one thread per output element.
// Backward: dwte rows take their tokens' gradients with atomic adds (tokens
// repeat, so rows have several writers; the sum's order varies from run to
// run), dwpe one thread per (t, c) summing over the batch.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/launch.cuh"

namespace strata::kernels::cuda {

namespace {

__global__ void embedding_forward_kernel(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                                         int T, int C, int v_begin, int v_count, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t bt = i / C;
    const int c = int(i % C), t = int(bt % T);
    const int row = tokens[bt] - v_begin;
    float v = (v_count < 0 || (row >= 0 && row < v_count)) ? wte[std::int64_t(row) * C + c] : 0.0f;
    if (wpe != nullptr) v += wpe[std::int64_t(t) * C + c];
    out[i] = v;
  }
}

__global__ void embedding_backward_wte(float* dwte, const float* dout, const std::int32_t* tokens, int C, int v_begin,
                                       int v_count, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t bt = i / C;
    const int row = tokens[bt] - v_begin;
    if (v_count < 0 || (row >= 0 && row < v_count)) atomicAdd(&dwte[std::int64_t(row) * C + i % C], dout[i]);
  }
}

__global__ void embedding_backward_wpe(float* dwpe, const float* dout, int B, int T, int C) {
  const std::int64_t tc = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (tc >= std::int64_t(T) * C) return;
  float acc = 0.0f;
  for (int b = 0; b < B; ++b) acc += dout[std::int64_t(b) * T * C + tc];
  dwpe[tc] += acc;
}


}  // namespace

void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                       int v_begin, int v_count) {
  const std::int64_t n = std::int64_t(B) * T * C;
  if (n == 0) return;
  embedding_forward_kernel<<<blocks_for(n), kThreads>>>(out, tokens, wte, wpe, T, C, v_begin, v_count, n);
  STRATA_CHECK_LAUNCH();
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int B, int T, int C,
                        int v_begin, int v_count) {
  const std::int64_t n = std::int64_t(B) * T * C;
  if (n == 0) return;
  embedding_backward_wte<<<blocks_for(n), kThreads>>>(dwte, dout, tokens, C, v_begin, v_count, n);
  STRATA_CHECK_LAUNCH();
  if (dwpe != nullptr) {
    embedding_backward_wpe<<<blocks_for(std::int64_t(T) * C), kThreads>>>(dwpe, dout, B, T, C);
    STRATA_CHECK_LAUNCH();
  }
}

void add_position_rows(float* out, const float* wpe, int rows, int C, int T, int r0) {
  launch(std::int64_t(rows) * C, [=] __device__(std::int64_t i) {
    const std::int64_t row = i / C, c = i % C;
    out[i] += wpe[((r0 + row) % T) * C + c];
  });
}

}  // namespace strata::kernels::cuda
