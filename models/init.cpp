#include "models/init.hpp"

#include <cmath>

namespace strata::models {

std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint64_t hash_name(std::string_view name) {
  std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a, then mixed
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return mix64(h);
}

double keyed_normal(std::uint64_t seed, std::uint64_t name_hash, std::int64_t index) {
  std::uint64_t base = mix64(seed ^ mix64(name_hash + std::uint64_t(index) * 2));
  std::uint64_t a = mix64(base), b = mix64(base ^ 0x5851f42d4c957f2dULL);
  // 53-bit uniforms in (0, 1]: log(u1) is finite.
  double u1 = (double(a >> 11) + 1.0) * 0x1.0p-53;
  double u2 = double(b >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

void init_param(float* out, const ParamSpec& spec, std::uint64_t seed, std::int64_t begin, std::int64_t count) {
  switch (spec.init) {
    case Init::zeros:
      for (std::int64_t k = 0; k < count; ++k) out[k] = 0.0f;
      break;
    case Init::ones:
      for (std::int64_t k = 0; k < count; ++k) out[k] = 1.0f;
      break;
    case Init::normal: {
      const std::uint64_t h = hash_name(spec.name);
#pragma omp parallel for schedule(static)
      for (std::int64_t k = 0; k < count; ++k)
        out[k] = float(spec.init_std * keyed_normal(seed, h, spec.global_index(begin + k)));
      break;
    }
  }
}

}  // namespace strata::models
