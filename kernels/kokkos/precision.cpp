// The optimizer's reduction over many tensors, from sum_squares.
#include "kernels/kokkos/kokkos_kernels.hpp"
#include "kernels/kokkos/views.hpp"
#include "kernels/sum_squares_tensors.hpp"

namespace strata::kernels::kokkos {

// xs, ns and divisors are host arrays (of device pointers).
double sum_squares_tensors(const void* const* xs, const std::int64_t* ns, const double* divisors, int count,
                           core::Precision p) {
  return sum_squares_tensors_each(xs, ns, divisors, count, p, sum_squares);
}

}  // namespace strata::kernels::kokkos
