// AdamW, one fused pass over a flat parameter buffer. It follows the order of
// operations of torch.optim.AdamW's single-tensor path (the one PyTorch uses
// for CPU tensors), so that a parity test can compare trajectories tightly.
// The mixed-precision form runs the same per-element arithmetic (AdamWStep,
// shared with the CUDA backend) on the fp32 master weights.
#include <cmath>
#include <cstdint>

#include "kernels/adamw_step.hpp"
#include "kernels/cpu/cpu_kernels.hpp"

namespace strata::kernels::cpu {

void adamw_update(float* param, const float* grad, float* m, float* v, std::int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int step) {
  const AdamWStep s(lr, beta1, beta2, eps, weight_decay, step);
#pragma omp parallel for simd schedule(static) if (n >= (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) param[i] = s(param[i], grad[i], m[i], v[i]);
}

void adamw_update_mixed(float* master, std::uint16_t* param, const std::uint16_t* grad, float grad_scale, float* m,
                        float* v, std::int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                        int step, core::Precision p) {
  const AdamWStep s(lr, beta1, beta2, eps, weight_decay, step);
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) {
    master[i] = s(master[i], core::half_to_float(grad[i], p) * grad_scale, m[i], v[i]);
    param[i] = core::float_to_half(master[i], p);
  }
}

}  // namespace strata::kernels::cpu
