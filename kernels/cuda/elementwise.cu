// Pointwise kernels (GELU, SwiGLU, residuals): one thread per element in a
// grid-stride loop, the arithmetic written as the CPU backend writes it
// (kernels/cpu/elementwise.cpp) so that fp32 results agree to rounding; and
// the column sums of bias gradients (the sums of squares behind gradient
// clipping are in precision.cu).
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/launch.cuh"

namespace strata::kernels::cuda {

namespace {

constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

// GELU, tanh approximation through 0.5 (1 + tanh(u)) = sigmoid(2u), as the CPU backend.
__device__ float gelu(float x) {
  const float u = kGeluS * (x + kGeluA * x * x * x);
  return x / (1.0f + expf(-2.0f * u));
}

// d/dx [x sigmoid(2u)] = sig + x 2 u' sig (1 - sig), with 1 - sig = e sig
// computed without subtracting from 1 (as the CPU backend).
__device__ float gelu_grad(float x) {
  const float u = kGeluS * (x + kGeluA * x * x * x);
  const float du = kGeluS * (1.0f + 3.0f * kGeluA * x * x);
  const float e = expf(-2.0f * u);
  const float sig = 1.0f / (1.0f + e);
  return sig + 2.0f * x * du * (e * sig) * sig;
}

// SiLU's logistic factor sig(g) = 1 / (1 + e^-g), as the CPU backend: at
// g below about -88 e^-g is inf and sig 0, so silu(g) = g sig and its
// derivative sig (1 + g (1 - sig)) go to 0 without a NaN (1 - sig is not
// written e^-g sig, which would be inf 0 there).
__device__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

// Column sums for bias gradients (launch.cuh's column blocks), in double
// over each block's rows.
__global__ void column_sums(float* dbias, const float* dout, int N, int C) {
  __shared__ double part[kRowLanes][kColumnTile];
  const int c = blockIdx.x * kColumnTile + threadIdx.x;
  int first = 0, last = 0;
  chunk_rows(N, &first, &last);
  double acc = 0;
  if (c < C)
    for (int n = first + int(threadIdx.y); n < last; n += kRowLanes) acc += dout[std::int64_t(n) * C + c];
  add_column_partial(dbias, c, C, acc, part);
}

}  // namespace

void bias_backward(float* dbias, const float* dout, int N, int C) {
  if (C <= 0) return;
  if (N <= 0) return;
  column_sums<<<column_grid(N, C), column_block()>>>(dbias, dout, N, C);
  STRATA_CHECK_LAUNCH();
}

void residual_forward(float* out, const float* a, const float* b, std::int64_t n) {
  launch(n, [=] __device__(std::int64_t i) { out[i] = a[i] + b[i]; });
}

void add_inplace(float* y, const float* x, std::int64_t n) {
  launch(n, [=] __device__(std::int64_t i) { y[i] += x[i]; });
}

void scale_inplace(float* x, float s, std::int64_t n) {
  launch(n, [=] __device__(std::int64_t i) { x[i] *= s; });
}

void fill_zero(float* x, std::int64_t n) {
  if (n > 0) STRATA_CHECK_CUDA(cudaMemsetAsync(x, 0, std::size_t(n) * sizeof(float)));
}

void bias_add(float* out, const float* bias, int N, int C) {
  launch(std::int64_t(N) * C, [=] __device__(std::int64_t i) { out[i] += bias[i % C]; });
}

// SwiGLU, one thread per output element: the gate at column f of the
// input row, the up projection at F + f.
void swiglu_forward(float* out, const float* inp, int N, int F) {
  launch(std::int64_t(N) * F, [=] __device__(std::int64_t i) {
    const std::int64_t n = i / F, f = i % F;
    const float g = inp[n * 2 * F + f], u = inp[n * 2 * F + F + f];
    out[i] = g / (1.0f + expf(-g)) * u;  // silu(g) up, as the CPU backend writes it
  });
}

// d gate = dout up silu'(g), d up = dout silu(g); silu(g) = g sig(g),
// silu'(g) = sig (1 + g (1 - sig)).
void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) {
  launch(std::int64_t(N) * F, [=] __device__(std::int64_t i) {
    const std::int64_t n = i / F, f = i % F;
    const std::int64_t ig = n * 2 * F + f, iu = ig + F;
    const float g = inp[ig], u = inp[iu], dy = dout[i], sig = sigmoid(g);
    dinp[ig] += dy * u * sig * (1.0f + g * (1.0f - sig));
    dinp[iu] += dy * g * sig;
  });
}

void gelu_forward(float* out, const float* inp, std::int64_t n) {
  launch(n, [=] __device__(std::int64_t i) { out[i] = gelu(inp[i]); });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) {
  launch(n, [=] __device__(std::int64_t i) { dinp[i] += gelu_grad(inp[i]) * dout[i]; });
}

}  // namespace strata::kernels::cuda
