// AdamW, one pass over a flat buffer, with the per-element arithmetic the CPU
// and CUDA backends share (kernels/adamw_step.hpp), built without contracted
// multiply-adds as theirs are: the same IEEE operations, the same results.
#include "kernels/adamw_step.hpp"
#include "kernels/kokkos/kokkos_kernels.hpp"
#include "kernels/kokkos/views.hpp"

namespace strata::kernels::kokkos {

void adamw_update(float* param, const float* grad, float* m, float* v, std::int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int step) {
  const AdamWStep s(lr, beta1, beta2, eps, weight_decay, step);
  Kokkos::parallel_for(
      "strata::adamw_update", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) { param[i] = s(param[i], grad[i], m[i], v[i]); });
}

void adamw_update_mixed(float* master, std::uint16_t* param, const std::uint16_t* grad, float grad_scale, float* m,
                        float* v, std::int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                        int step, core::Precision p) {
  const AdamWStep s(lr, beta1, beta2, eps, weight_decay, step);
  Kokkos::parallel_for(
      "strata::adamw_update_mixed", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        master[i] = s(master[i], core::half_to_float(grad[i], p) * grad_scale, m[i], v[i]);
        param[i] = core::float_to_half(master[i], p);
      });
}

}  // namespace strata::kernels::kokkos
