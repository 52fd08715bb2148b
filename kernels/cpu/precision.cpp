// The optimizer's reductions and its mixed-precision step on the host; the
// scalar rounding is core's, so every conversion in the program rounds
// alike.
#include <cstdint>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/sum_squares_tensors.hpp"

namespace strata::kernels::cpu {

double sum_squares_tensors(const void* const* xs, const std::int64_t* ns, const double* divisors, int count,
                           core::Precision p) {
  return sum_squares_tensors_each(xs, ns, divisors, count, p, sum_squares);
}

}  // namespace strata::kernels::cpu
