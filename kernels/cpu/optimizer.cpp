// AdamW, one fused pass over a flat parameter buffer. It follows the order of
// operations of torch.optim.AdamW's single-tensor path (the one PyTorch uses
// for CPU tensors), so that a parity test can compare trajectories tightly.
#include <cmath>
#include <cstdint>

#include "kernels/kernels.hpp"

namespace strata::kernels {

void adamw_update(float* param, const float* grad, float* m, float* v, std::int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int step) {
  // Scalars in double, then rounded once, as PyTorch does with Python floats.
  const float decay = float(1.0 - double(lr) * double(weight_decay));
  const float w1 = float(1.0 - double(beta1));
  const float w2 = float(1.0 - double(beta2));
  const double bias_correction1 = 1.0 - std::pow(double(beta1), step);
  const double bias_correction2 = 1.0 - std::pow(double(beta2), step);
  const float neg_step_size = float(-(double(lr) / bias_correction1));
  const float bias_correction2_sqrt = float(std::sqrt(bias_correction2));
  // torch updates m with lerp(m, g, 1 - beta1), whose formula depends on
  // whether the weight is below one half.
  const bool small_w1 = w1 < 0.5f;
#pragma omp parallel for simd schedule(static) if (n >= (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float p = param[i] * decay;
    const float mi = small_w1 ? m[i] + w1 * (g - m[i]) : g - (g - m[i]) * (1.0f - w1);
    const float vi = v[i] * beta2 + w2 * g * g;
    const float denom = std::sqrt(vi) / bias_correction2_sqrt + eps;
    param[i] = p + neg_step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace strata::kernels
