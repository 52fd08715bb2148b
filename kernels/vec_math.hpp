// Vector-friendly math shared by the host-side kernels: the CPU backend's, and
// the Kokkos backend's (on any execution space: the functions are host and
// device functions).
#pragma once

#include <cstdint>

#include "kernels/foundation/precision.hpp"

namespace strata::kernels {

// exp(x) to within 2 ulp, vectorisable. glibc's expf stays scalar without
// -ffast-math (about 9x slower here), so the loops that need exp use this
// plain-arithmetic version instead: x = n ln2 + r with |r| <= ln2/2, a Cephes
// polynomial for exp(r), and 2^n written into the exponent bits. |x| is clamped
// to 87 so that the result stays a normal float (exp(-87) = 1.6e-38 stands in
// for smaller values); the clamp works on the bit pattern because GCC will not
// vectorise a float compare-and-select under the default -ftrapping-math.
// NaN stays NaN.
STRATA_HOST_DEVICE inline float exp_vec(float x) {
  const std::uint32_t bits = core::bits_as<std::uint32_t>(x);
  std::uint32_t mag = bits & 0x7fffffffu;
  constexpr std::uint32_t kLimit = 0x42ae0000u;  // 87.0f
  mag = (mag > 0x7f800000u || mag < kLimit) ? mag : kLimit;
  x = core::bits_as<float>((bits & 0x80000000u) | mag);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f;  // ln2 split in two so that n * hi is exact
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const std::int32_t two_n = (static_cast<std::int32_t>(n) + 127) << 23;
  return p * core::bits_as<float>(two_n);
}

}  // namespace strata::kernels
