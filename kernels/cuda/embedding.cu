// Token + position embedding. Forward: one thread per output element.
// Backward: dwte rows take their tokens' gradients with atomic adds (tokens
// repeat, so rows have several writers; the sum's order varies from run to
// run), dwpe one thread per (t, c) summing over the batch. Tables and rows
// in the call's format; the gradients fp32.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/launch.cuh"

namespace strata::kernels::cuda {

namespace {

template <typename E>
__global__ void embedding_forward_kernel(E* out, const std::int32_t* tokens, const E* wte, const E* wpe, int T, int C,
                                         int v_begin, int v_count, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t bt = i / C;
    const int c = int(i % C), t = int(bt % T);
    const int row = tokens[bt] - v_begin;
    float v = (v_count < 0 || (row >= 0 && row < v_count)) ? to_float(wte[std::int64_t(row) * C + c]) : 0.0f;
    if (wpe != nullptr) v += to_float(wpe[std::int64_t(t) * C + c]);
    out[i] = from_float<E>(v);
  }
}

template <typename E>
__global__ void embedding_backward_wte(float* dwte, const E* dout, const std::int32_t* tokens, int C, int v_begin,
                                       int v_count, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t bt = i / C;
    const int row = tokens[bt] - v_begin;
    if (v_count < 0 || (row >= 0 && row < v_count)) atomicAdd(&dwte[std::int64_t(row) * C + i % C], to_float(dout[i]));
  }
}

template <typename E>
__global__ void embedding_backward_wpe(float* dwpe, const E* dout, int B, int T, int C) {
  const std::int64_t tc = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (tc >= std::int64_t(T) * C) return;
  float acc = 0.0f;
  for (int b = 0; b < B; ++b) acc += to_float(dout[std::int64_t(b) * T * C + tc]);
  dwpe[tc] += acc;
}


template <typename E>
void embedding_forward_(E* out, const std::int32_t* tokens, const E* wte, const E* wpe, int T, int C, int v_begin,
                        int v_count, std::int64_t n) {
  embedding_forward_kernel<E><<<blocks_for(n), kThreads>>>(out, tokens, wte, wpe, T, C, v_begin, v_count, n);
  STRATA_CHECK_LAUNCH();
}

template <typename E>
void embedding_backward_(float* dwte, float* dwpe, const E* dout, const std::int32_t* tokens, int B, int T, int C,
                         int v_begin, int v_count, std::int64_t n) {
  embedding_backward_wte<E><<<blocks_for(n), kThreads>>>(dwte, dout, tokens, C, v_begin, v_count, n);
  STRATA_CHECK_LAUNCH();
  if (dwpe != nullptr) {
    embedding_backward_wpe<E><<<blocks_for(std::int64_t(T) * C), kThreads>>>(dwpe, dout, B, T, C);
    STRATA_CHECK_LAUNCH();
  }
}

template <typename E>
void add_position_rows_(E* out, const E* wpe, int rows, int C, int T, int r0) {
  launch(std::int64_t(rows) * C, [=] __device__(std::int64_t i) {
    const std::int64_t row = i / C, c = i % C;
    out[i] = from_float<E>(to_float(out[i]) + to_float(wpe[((r0 + row) % T) * C + c]));
  });
}

}  // namespace

void embedding_forward(core::Ptr out, const std::int32_t* tokens, core::CPtr wte, core::CPtr wpe, int B, int T, int C,
                       int v_begin, int v_count) {
  const std::int64_t n = std::int64_t(B) * T * C;
  if (n == 0) return;
  STRATA_BY_FORMAT(out, embedding_forward_(out.as<E>(), tokens, wte.as<E>(), wpe.as<E>(), T, C, v_begin, v_count, n));
}

void embedding_backward(float* dwte, float* dwpe, core::CPtr dout, const std::int32_t* tokens, int B, int T, int C,
                        int v_begin, int v_count) {
  const std::int64_t n = std::int64_t(B) * T * C;
  if (n == 0) return;
  STRATA_BY_FORMAT(dout, embedding_backward_(dwte, dwpe, dout.as<E>(), tokens, B, T, C, v_begin, v_count, n));
}

void add_position_rows(core::Ptr out, core::CPtr wpe, int rows, int C, int T, int r0) {
  STRATA_BY_FORMAT(out, add_position_rows_(out.as<E>(), wpe.as<E>(), rows, C, T, r0));
}

}  // namespace strata::kernels::cuda
