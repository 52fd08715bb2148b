// Pointwise kernels (GELU, SwiGLU, residuals): one thread per element in a
// grid-stride loop, the arithmetic written as the CPU backend writes it
// (kernels/cpu/elementwise.cpp) so that fp32 results agree to rounding; and
// the column sums of bias gradients (the sums of squares behind gradient
// clipping are in precision.cu). Templates over the element type E: read as
// fp32, each element rounded once as it is written.
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
template <typename E>
__global__ void column_sums(float* dbias, const E* dout, int N, int C) {
  __shared__ double part[kRowLanes][kColumnTile];
  const int c = blockIdx.x * kColumnTile + threadIdx.x;
  int first = 0, last = 0;
  chunk_rows(N, &first, &last);
  double acc = 0;
  if (c < C)
    for (int n = first + int(threadIdx.y); n < last; n += kRowLanes) acc += to_float(dout[std::int64_t(n) * C + c]);
  add_column_partial(dbias, c, C, acc, part);
}

template <typename E>
void bias_backward_(float* dbias, const E* dout, int N, int C) {
  column_sums<E><<<column_grid(N, C), column_block()>>>(dbias, dout, N, C);
  STRATA_CHECK_LAUNCH();
}

template <typename E>
void residual_forward_(E* out, const E* a, const E* b, std::int64_t n) {
  launch(n, [=] __device__(std::int64_t i) { out[i] = from_float<E>(to_float(a[i]) + to_float(b[i])); });
}

template <typename Y, typename X>
void add_inplace_(Y* y, const X* x, std::int64_t n) {
  launch(n, [=] __device__(std::int64_t i) { y[i] = from_float<Y>(to_float(y[i]) + to_float(x[i])); });
}

template <typename Y, typename X>
void convert_(Y* y, const X* x, std::int64_t n) {
  launch(n, [=] __device__(std::int64_t i) { y[i] = from_float<Y>(to_float(x[i])); });
}

template <typename D, typename S>
void copy_rows_(D* dst, std::int64_t ld_dst, const S* src, std::int64_t ld_src, std::int64_t rows, std::int64_t cols,
                bool add) {
  launch(rows * cols, [=] __device__(std::int64_t i) {
    const std::int64_t r = i / cols, c = i % cols;
    D& d = dst[r * ld_dst + c];
    const float x = to_float(src[r * ld_src + c]);
    d = from_float<D>(add ? to_float(d) + x : x);
  });
}

template <typename E>
void scale_inplace_(E* x, float s, std::int64_t n) {
  launch(n, [=] __device__(std::int64_t i) { x[i] = from_float<E>(to_float(x[i]) * s); });
}

template <typename E>
void bias_add_(E* out, const E* bias, int N, int C) {
  launch(std::int64_t(N) * C,
         [=] __device__(std::int64_t i) { out[i] = from_float<E>(to_float(out[i]) + to_float(bias[i % C])); });
}

// SwiGLU, one thread per output element: the gate at column f of the
// input row, the up projection at F + f.
template <typename E>
void swiglu_forward_(E* out, const E* inp, int N, int F) {
  launch(std::int64_t(N) * F, [=] __device__(std::int64_t i) {
    const std::int64_t n = i / F, f = i % F;
    const float g = to_float(inp[n * 2 * F + f]), u = to_float(inp[n * 2 * F + F + f]);
    out[i] = from_float<E>(g / (1.0f + expf(-g)) * u);  // silu(g) up, as the CPU backend writes it
  });
}

// d gate = dout up silu'(g), d up = dout silu(g); silu(g) = g sig(g),
// silu'(g) = sig (1 + g (1 - sig)).
template <typename E>
void swiglu_backward_(E* dinp, const E* inp, const E* dout, int N, int F) {
  launch(std::int64_t(N) * F, [=] __device__(std::int64_t i) {
    const std::int64_t n = i / F, f = i % F;
    const std::int64_t ig = n * 2 * F + f, iu = ig + F;
    const float g = to_float(inp[ig]), u = to_float(inp[iu]), dy = to_float(dout[i]), sig = sigmoid(g);
    dinp[ig] = from_float<E>(to_float(dinp[ig]) + dy * u * sig * (1.0f + g * (1.0f - sig)));
    dinp[iu] = from_float<E>(to_float(dinp[iu]) + dy * g * sig);
  });
}

template <typename E>
void gelu_forward_(E* out, const E* inp, std::int64_t n) {
  launch(n, [=] __device__(std::int64_t i) { out[i] = from_float<E>(gelu(to_float(inp[i]))); });
}

template <typename E>
void gelu_backward_(E* dinp, const E* inp, const E* dout, std::int64_t n) {
  launch(n, [=] __device__(std::int64_t i) {
    dinp[i] = from_float<E>(to_float(dinp[i]) + gelu_grad(to_float(inp[i])) * to_float(dout[i]));
  });
}

}  // namespace

void bias_backward(float* dbias, core::CPtr dout, int N, int C) {
  if (C <= 0 || N <= 0) return;
  STRATA_BY_FORMAT(dout, bias_backward_(dbias, dout.as<E>(), N, C));
}

void residual_forward(core::Ptr out, core::CPtr a, core::CPtr b, std::int64_t n) {
  STRATA_BY_FORMAT(out, residual_forward_(out.as<E>(), a.as<E>(), b.as<E>(), n));
}

void add_inplace(core::Ptr y, core::CPtr x, std::int64_t n) {
  core::with_formats(y.precision(), x.precision(),
             [&](auto yt, auto xt) { add_inplace_(y.as<decltype(yt)>(), x.as<decltype(xt)>(), n); });
}

void convert(core::Ptr y, core::CPtr x, std::int64_t n) {
  core::with_formats(y.precision(), x.precision(),
             [&](auto yt, auto xt) { convert_(y.as<decltype(yt)>(), x.as<decltype(xt)>(), n); });
}

void copy_rows(core::Ptr dst, std::int64_t ld_dst, core::CPtr src, std::int64_t ld_src, std::int64_t rows,
               std::int64_t cols, bool add) {
  if (rows <= 0 || cols <= 0) return;
  if (!add && dst.precision() == src.precision()) {  // a plain copy: the copy engine's
    const std::size_t e = std::size_t(dst.element_bytes());
    STRATA_CHECK_CUDA(cudaMemcpy2DAsync(dst.get(), std::size_t(ld_dst) * e, src.get(), std::size_t(ld_src) * e,
                                        std::size_t(cols) * e, std::size_t(rows), cudaMemcpyDeviceToDevice));
    return;
  }
  core::with_formats(dst.precision(), src.precision(), [&](auto dt, auto st) {
    copy_rows_(dst.as<decltype(dt)>(), ld_dst, src.as<decltype(st)>(), ld_src, rows, cols, add);
  });
}

void scale_inplace(core::Ptr x, float s, std::int64_t n) { STRATA_BY_FORMAT(x, scale_inplace_(x.as<E>(), s, n)); }

void fill_zero(core::Ptr x, std::int64_t n) {
  if (n > 0) STRATA_CHECK_CUDA(cudaMemsetAsync(x.get(), 0, std::size_t(n) * std::size_t(x.element_bytes())));
}

void bias_add(core::Ptr out, core::CPtr bias, int N, int C) {
  STRATA_BY_FORMAT(out, bias_add_(out.as<E>(), bias.as<E>(), N, C));
}

void swiglu_forward(core::Ptr out, core::CPtr inp, int N, int F) {
  STRATA_BY_FORMAT(out, swiglu_forward_(out.as<E>(), inp.as<E>(), N, F));
}

void swiglu_backward(core::Ptr dinp, core::CPtr inp, core::CPtr dout, int N, int F) {
  STRATA_BY_FORMAT(dinp, swiglu_backward_(dinp.as<E>(), inp.as<E>(), dout.as<E>(), N, F));
}

void gelu_forward(core::Ptr out, core::CPtr inp, std::int64_t n) {
  STRATA_BY_FORMAT(out, gelu_forward_(out.as<E>(), inp.as<E>(), n));
}

void gelu_backward(core::Ptr dinp, core::CPtr inp, core::CPtr dout, std::int64_t n) {
  STRATA_BY_FORMAT(dinp, gelu_backward_(dinp.as<E>(), inp.as<E>(), dout.as<E>(), n));
}

}  // namespace strata::kernels::cuda
