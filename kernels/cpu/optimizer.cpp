// AdamW, one fused pass over a flat parameter buffer. It follows the order of
// operations of torch.optim.AdamW's single-tensor path (the one PyTorch uses
// for CPU tensors), so that a parity test can compare trajectories tightly.
// The mixed-precision form runs the same per-element arithmetic on the fp32
// master weights.
#include <cmath>
#include <cstdint>

#include "kernels/kernels.hpp"

namespace strata::kernels {

namespace {

struct AdamWStep {
  float decay, w1, beta2, w2, neg_step_size, bias_correction2_sqrt, eps;
  bool small_w1;

  AdamWStep(float lr, float beta1, float beta2_, float eps_, float weight_decay, int step) {
    // Scalars in double, then rounded once, as PyTorch does with Python floats.
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
  float operator()(float param, float g, float& m, float& v) const {
    const float p = param * decay;
    const float mi = small_w1 ? m + w1 * (g - m) : g - (g - m) * (1.0f - w1);
    const float vi = v * beta2 + w2 * g * g;
    const float denom = std::sqrt(vi) / bias_correction2_sqrt + eps;
    m = mi;
    v = vi;
    return p + neg_step_size * mi / denom;
  }
};

}  // namespace

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

}  // namespace strata::kernels
