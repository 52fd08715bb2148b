// AdamW over a flat buffer, one thread per element, with the CPU backend's
// scalars and per-element arithmetic (kernels/adamw_step.hpp), so that the
// two backends' updates agree to rounding.
#include <cstdint>

#include "kernels/adamw_step.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"

namespace strata::kernels::cuda {

namespace {

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, std::int64_t n, AdamWStep s) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    param[i] = s(param[i], grad[i], m[i], v[i]);
}

}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, std::int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int step) {
  if (n <= 0) return;
  const AdamWStep s(lr, beta1, beta2, eps, weight_decay, step);
  const std::int64_t blocks = (n + 255) / 256;
  adamw_kernel<<<int(blocks < 65535 * 16 ? blocks : 65535 * 16), 256>>>(param, grad, m, v, n, s);
  STRATA_CHECK_LAUNCH();
}

}  // namespace strata::kernels::cuda
