// The gradient norm's sum of squares over many tensors (fp32 or 16-bit) on
// the host, through the shared walk of kernels/sum_squares_tensors.hpp.
#include <cstdint>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/sum_squares_tensors.hpp"

namespace strata::kernels::cpu {

double sum_squares_tensors(const void* const* xs, const std::int64_t* ns, const double* divisors, int count,
                           core::Precision p) {
  return sum_squares_tensors_each(xs, ns, divisors, count, p, sum_squares);
}

}  // namespace strata::kernels::cpu
