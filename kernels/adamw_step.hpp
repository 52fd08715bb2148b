// One AdamW step's scalars and per-element arithmetic, shared by the CPU and
// CUDA backends so that both follow torch.optim.AdamW's single-tensor path
// operation for operation: the scalars in double, rounded once (as PyTorch
// does with Python floats), the element update in float.
#pragma once

#include <cmath>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

namespace strata::kernels {

struct AdamWStep {
  float decay, w1, beta2, w2, neg_step_size, bias_correction2_sqrt, eps;
  bool small_w1;

  AdamWStep(float lr, float beta1, float beta2_, float eps_, float weight_decay, int step) {
    decay = float(1.0 - double(lr) * double(weight_decay));
    w1 = float(1.0 - double(beta1));
    beta2 = beta2_;
    w2 = float(1.0 - double(beta2_));
    const double bias_correction1 = 1.0 - std::pow(double(beta1), step);
    const double bias_correction2 = 1.0 - std::pow(double(beta2_), step);
    neg_step_size = float(-(double(lr) / bias_correction1));
    bias_correction2_sqrt = float(std::sqrt(bias_correction2));
    eps = eps_;
    // torch updates m with lerp(m, g, 1 - beta1), whose formula depends on
    // whether the weight is below one half.
    small_w1 = w1 < 0.5f;
  }

  // The new parameter; m and v updated in place.
  STRATA_HOST_DEVICE float operator()(float param, float g, float& m, float& v) const {
    const float p = param * decay;
    const float mi = small_w1 ? m + w1 * (g - m) : g - (g - m) * (1.0f - w1);
    const float vi = v * beta2 + w2 * g * g;
    const float denom = sqrtf(vi) / bias_correction2_sqrt + eps;
    m = mi;
    v = vi;
    return p + neg_step_size * mi / denom;
  }
};

}  // namespace strata::kernels
