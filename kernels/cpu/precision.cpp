// Bulk conversions between fp32 and the 16-bit formats, and the reductions
// the mixed-precision state needs; the scalar rounding is core's, so every
// conversion in the program rounds alike.
#include <cstdint>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/sum_squares_tensors.hpp"

namespace strata::kernels::cpu {

using core::Precision;

void widen(float* y, const std::uint16_t* x, std::int64_t n, Precision p) {
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) y[i] = core::half_to_float(x[i], p);
}

void narrow(std::uint16_t* y, const float* x, std::int64_t n, Precision p) {
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) y[i] = core::float_to_half(x[i], p);
}

void narrow_add(std::uint16_t* y, const float* x, std::int64_t n, Precision p) {
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) y[i] = core::float_to_half(core::half_to_float(y[i], p) + x[i], p);
}

void add_half(std::uint16_t* y, const std::uint16_t* x, std::int64_t n, Precision p) {
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
  for (std::int64_t i = 0; i < n; ++i)
    y[i] = core::float_to_half(core::half_to_float(y[i], p) + core::half_to_float(x[i], p), p);
}

double sum_squares_half(const std::uint16_t* x, std::int64_t n, Precision p) {
  double s = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = core::half_to_float(x[i], p);
    s += v * v;
  }
  return s;
}

double sum_squares_tensors(const void* const* xs, const std::int64_t* ns, const double* divisors, int count,
                           Precision p) {
  return sum_squares_tensors_each(xs, ns, divisors, count, p, sum_squares, sum_squares_half);
}

}  // namespace strata::kernels::cpu
