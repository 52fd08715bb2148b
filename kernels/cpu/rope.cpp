// Rotary position embedding (RoFormer), in place on the query and key heads
// of a qkv buffer. A row's angles depend on its position only, so they are
// computed once per row (in double, then rounded) and applied to every head
// and sequence.
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"

namespace strata::kernels::cpu {

namespace {

// sign +1 turns each pair forward by its angle, -1 back; each element is
// rounded once to the call's format.
template <typename E>
void rope(E* x, int B, int T, std::int64_t ld, int heads, int hs, int pos0, float theta, float sign) {
  const int pairs = hs / 2;
  // A pair's frequency theta^(-2i / hs) is the same at every position: one
  // pow per pair and call, not per row.
  std::vector<double> freq(static_cast<std::size_t>(pairs));
  for (int i = 0; i < pairs; ++i) freq[std::size_t(i)] = std::pow(double(theta), -2.0 * i / hs);
#pragma omp parallel for schedule(static) if (std::int64_t(B) * T * heads * hs >= (1 << 15))
  for (int t = 0; t < T; ++t) {
    thread_local std::vector<float> cs;
    cs.resize(std::size_t(2 * pairs));
    for (int i = 0; i < pairs; ++i) {
      const double angle = double(pos0 + t) * freq[std::size_t(i)];
      cs[std::size_t(2 * i)] = float(std::cos(angle));
      cs[std::size_t(2 * i + 1)] = sign * float(std::sin(angle));
    }
    for (int b = 0; b < B; ++b) {
      E* row = x + (std::int64_t(b) * T + t) * ld;
      for (int h = 0; h < heads; ++h) {
        E* v = row + std::int64_t(h) * hs;
        for (int i = 0; i < pairs; ++i) {
          const float c = cs[std::size_t(2 * i)], s = cs[std::size_t(2 * i + 1)];
          const float a = core::to_float(v[2 * i]), d = core::to_float(v[2 * i + 1]);
          v[2 * i] = core::from_float<E>(a * c - d * s);
          v[2 * i + 1] = core::from_float<E>(a * s + d * c);
        }
      }
    }
  }
}

}  // namespace

void rope_forward(core::Ptr x, int B, int T, std::int64_t ld, int heads, int hs, int pos0, float theta) {
  STRATA_BY_FORMAT(x, rope(x.as<E>(), B, T, ld, heads, hs, pos0, theta, 1.0f));
}

void rope_backward(core::Ptr dx, int B, int T, std::int64_t ld, int heads, int hs, int pos0, float theta) {
  STRATA_BY_FORMAT(dx, rope(dx.as<E>(), B, T, ld, heads, hs, pos0, theta, -1.0f));
}

}  // namespace strata::kernels::cpu
