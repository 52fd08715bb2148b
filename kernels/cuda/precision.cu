// Sums of squares of fp32 and 16-bit buffers and the mixed-precision AdamW
// step. Every element runs the CPU backend's code (core's scalar
// conversions, AdamWStep), so the two backends' 16-bit results are
// bit-identical; only the sum of squares adds in another order.
#include <algorithm>
#include <cstdint>

#include "kernels/adamw_step.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/launch.cuh"

namespace strata::kernels::cuda {

using core::Precision;

namespace {

// Sums of squares of fp32 or 16-bit elements: per-thread partial sums in
// double, divided by `divisor`, added atomically into *out.
__global__ void sum_squares_kernel(double* out, const void* x, std::int64_t n, Precision p, double divisor) {
  double acc = 0;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const double v = p == Precision::fp32 ? double(static_cast<const float*>(x)[i])
                                          : double(core::half_to_float(static_cast<const std::uint16_t*>(x)[i], p));
    acc += v * v;
  }
  add_to_slot(out, acc / divisor);
}

}  // namespace

// Every tensor's kernel adds into one device double; the host reads it once.
double sum_squares_tensors(const void* const* xs, const std::int64_t* ns, const double* divisors, int count,
                           Precision p) {
  double* d = reduction_slot();
  STRATA_CHECK_CUDA(cudaMemsetAsync(d, 0, sizeof(double)));
  for (int k = 0; k < count; ++k) {
    if (ns[k] <= 0) continue;
    sum_squares_kernel<<<std::min(blocks_for(ns[k]), 1024), kThreads>>>(d, xs[k], ns[k], p, divisors[k]);
    STRATA_CHECK_LAUNCH();
  }
  double h = 0;
  copy_bytes(&h, d, sizeof(double));
  return h;
}

double sum_squares(core::CPtr x, std::int64_t n) {
  const void* xs[] = {x.get()};
  const double one[] = {1.0};
  return sum_squares_tensors(xs, &n, one, 1, x.precision());
}

void adamw_update_mixed(float* master, std::uint16_t* param, const std::uint16_t* grad, float grad_scale, float* m,
                        float* v, std::int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                        int step, Precision p) {
  // The step's scalars are computed on the host, by the same code as the CPU's.
  const AdamWStep s(lr, beta1, beta2, eps, weight_decay, step);
  launch(n, [=] __device__(std::int64_t i) {
    master[i] = s(master[i], core::half_to_float(grad[i], p) * grad_scale, m[i], v[i]);
    param[i] = core::float_to_half(master[i], p);
  });
}

}  // namespace strata::kernels::cuda
