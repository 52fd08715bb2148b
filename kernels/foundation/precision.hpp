// Training precision and the two 16-bit formats. Mixed precision keeps
// parameters and gradients in a 16-bit format (2 bytes each) and the master
// weights and optimizer moments in fp32. The scalar conversions live here,
// at the bottom of the dependency graph, because kernels (bulk conversions,
// the mixed AdamW) and the communicator (summing 16-bit buffers) both need
// them and must round alike.
//
//   bf16: 1 sign, 8 exponent, 7 mantissa bits: fp32's range, 3 significant digits.
//   fp16: 1 sign, 5 exponent, 10 mantissa bits (IEEE binary16): largest finite
//         65504, smallest subnormal 2^-24; what loss scaling exists for.
// Both narrowings round to nearest, ties to even, as hardware does; values
// past fp16's range become +-inf, NaN stays NaN. The scalar conversions are
// host and device functions, so that the CUDA backend runs this very code and
// rounds bit for bit as the CPU does.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

// As in kernels/adamw_step.hpp (same definition, so either may come first).
#ifndef STRATA_HOST_DEVICE
#if defined(__CUDACC__) || defined(__HIPCC__)
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif
#endif

namespace strata::core {

// std::bit_cast is host-only for nvcc (a constexpr library function); the
// builtin behind it works on both sides.
template <typename To, typename From>
STRATA_HOST_DEVICE inline To bits_as(From x) {
  return __builtin_bit_cast(To, x);
}

enum class Precision { fp32, bf16, fp16 };

inline const char* precision_name(Precision p) {
  return p == Precision::bf16 ? "bf16" : p == Precision::fp16 ? "fp16" : "fp32";
}
inline std::optional<Precision> parse_precision(std::string_view s) {
  if (s == "fp32") return Precision::fp32;
  if (s == "bf16") return Precision::bf16;
  if (s == "fp16") return Precision::fp16;
  return std::nullopt;
}
// Bytes of one stored parameter or gradient element.
inline int element_bytes(Precision p) { return p == Precision::fp32 ? 4 : 2; }

STRATA_HOST_DEVICE inline float bf16_to_float(std::uint16_t h) { return bits_as<float>(std::uint32_t(h) << 16); }

STRATA_HOST_DEVICE inline std::uint16_t float_to_bf16(float f) {
  const std::uint32_t u = bits_as<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40);  // NaN stays quiet NaN
  // Round to nearest even: add half an ulp of bf16, plus one when the kept
  // part is odd, then truncate. Overflow carries into the exponent (inf).
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return std::uint16_t((u + rounding) >> 16);
}

STRATA_HOST_DEVICE inline float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return bits_as<float>(sign | 0x7f800000u | (man << 13));  // inf, NaN
  if (exp != 0) return bits_as<float>(sign | ((exp + 112) << 23) | (man << 13));
  // Zero and subnormals: man * 2^-24, exact in fp32.
  const float mag = float(man) * 0x1p-24f;
  return sign != 0 ? -mag : mag;
}

STRATA_HOST_DEVICE inline std::uint16_t float_to_fp16(float f) {
  const std::uint32_t u = bits_as<std::uint32_t>(f);
  const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return std::uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);  // >= 65520 rounds past 65504: inf
  if (a < 0x38800000u) {
    // Below the smallest normal (2^-14): a subnormal, round(|f| / 2^-24) with
    // ties to even. Adding 2^-24 * 2^23 = 0.5 makes the fp32 adder do exactly
    // that rounding in the low mantissa bits.
    const float r = bits_as<float>(a) + 0.5f;
    return std::uint16_t(sign | (bits_as<std::uint32_t>(r) - bits_as<std::uint32_t>(0.5f)));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 23-bit mantissa to
  // 10 bits, ties to even; a carry moves into the exponent correctly.
  const std::uint32_t rebased = a - (std::uint32_t(112) << 23);
  const std::uint32_t rounded = rebased + 0xfffu + ((rebased >> 13) & 1u);
  return std::uint16_t(sign | (rounded >> 13));
}

// One element at precision p (not fp32) to and from fp32.
STRATA_HOST_DEVICE inline float half_to_float(std::uint16_t h, Precision p) {
  return p == Precision::bf16 ? bf16_to_float(h) : fp16_to_float(h);
}
STRATA_HOST_DEVICE inline std::uint16_t float_to_half(float f, Precision p) {
  return p == Precision::bf16 ? float_to_bf16(f) : float_to_fp16(f);
}

}  // namespace strata::core
