// sum_squares_tensors (kernels/ops.inc) as one reduction per tensor, from a
// backend's own sum_squares and sum_squares_half: what the host-side
// backends (CPU, Kokkos) do; the CUDA backend sums every tensor into one
// device slot instead.
#pragma once

#include <cstdint>

#include "kernels/foundation/precision.hpp"

namespace strata::kernels {

template <class Fp32Sum, class HalfSum>
double sum_squares_tensors_each(const void* const* xs, const std::int64_t* ns, const double* divisors, int count,
                                core::Precision p, Fp32Sum fp32_sum, HalfSum half_sum) {
  double s = 0;
  for (int k = 0; k < count; ++k) {
    const double part = p == core::Precision::fp32 ? fp32_sum(static_cast<const float*>(xs[k]), ns[k])
                                                   : half_sum(static_cast<const std::uint16_t*>(xs[k]), ns[k], p);
    s += part / divisors[k];
  }
  return s;
}

}  // namespace strata::kernels
