// sum_squares_tensors (kernels/ops.inc) as one reduction per tensor, from a
// backend's own sum_squares: what the host-side
// backends (CPU, Kokkos) do; the CUDA backend sums every tensor into one
// device slot instead.
#pragma once

#include <cstdint>

#include "kernels/foundation/ptr.hpp"

namespace strata::kernels {

template <class Sum>
double sum_squares_tensors_each(const void* const* xs, const std::int64_t* ns, const double* divisors, int count,
                                core::Precision p, Sum sum) {
  double s = 0;
  for (int k = 0; k < count; ++k) s += sum(core::CPtr(xs[k], p), ns[k]) / divisors[k];
  return s;
}

}  // namespace strata::kernels
