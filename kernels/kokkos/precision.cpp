// Bulk conversions between fp32 and the 16-bit formats, and the reductions
// the mixed-precision state needs, on core's scalar rounding (host and device
// functions): bit-identical to the CPU backend's.
#include "kernels/kokkos/kokkos_kernels.hpp"
#include "kernels/kokkos/views.hpp"
#include "kernels/sum_squares_tensors.hpp"

namespace strata::kernels::kokkos {

using core::Precision;

void widen(float* y, const std::uint16_t* x, std::int64_t n, Precision p) {
  Kokkos::parallel_for("strata::widen", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) { y[i] = core::half_to_float(x[i], p); });
}

void narrow(std::uint16_t* y, const float* x, std::int64_t n, Precision p) {
  Kokkos::parallel_for("strata::narrow", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) { y[i] = core::float_to_half(x[i], p); });
}

void narrow_add(std::uint16_t* y, const float* x, std::int64_t n, Precision p) {
  Kokkos::parallel_for(
      "strata::narrow_add", Range(0, n),
      KOKKOS_LAMBDA(std::int64_t i) { y[i] = core::float_to_half(core::half_to_float(y[i], p) + x[i], p); });
}

void add_half(std::uint16_t* y, const std::uint16_t* x, std::int64_t n, Precision p) {
  Kokkos::parallel_for(
      "strata::add_half", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        y[i] = core::float_to_half(core::half_to_float(y[i], p) + core::half_to_float(x[i], p), p);
      });
}

double sum_squares_half(const std::uint16_t* x, std::int64_t n, Precision p) {
  return range_sum<double>("strata::sum_squares_half", n, KOKKOS_LAMBDA(std::int64_t i) {
    const double v = core::half_to_float(x[i], p);
    return v * v;
  });
}

// xs, ns and divisors are host arrays (of device pointers).
double sum_squares_tensors(const void* const* xs, const std::int64_t* ns, const double* divisors, int count,
                           Precision p) {
  return sum_squares_tensors_each(xs, ns, divisors, count, p, sum_squares, sum_squares_half);
}

}  // namespace strata::kernels::kokkos
