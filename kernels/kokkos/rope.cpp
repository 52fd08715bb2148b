// Rotary position embedding (RoFormer, Llama's pairing), in place, with the
// CPU backend's arithmetic: the angle p theta^(-2i / hs) and its cosine and
// sine in double, rounded to float once, then the pair turned in float. A
// team per row (b, t): its threads over the pairs i of a head vector, each
// taking the pair's cosine and sine once for all of the row's heads (the
// angle depends on the position and i only), which keeps the double-
// precision trigonometry to B T hs / 2 evaluations.
#include <cmath>

#include "kernels/kokkos/kokkos_kernels.hpp"
#include "kernels/kokkos/views.hpp"

namespace strata::kernels::kokkos {

namespace {

// Turns every pair by the row's angles, or back by them (sign -1: the
// rotation's transpose, which is its inverse; float(sin(-a)) = -float(sin(a))
// exactly, so the backward's factors are the forward's).
template <typename E>
void rope_rotate(const char* label, E* x, int B, int T, std::int64_t ld, int heads, int hs, int pos0,
                 float theta, float sign) {
  const int half = hs / 2;
  const double base = theta;
  Kokkos::parallel_for(
      label, rows_policy(std::int64_t(B) * T), KOKKOS_LAMBDA(const Member& m) {
        const std::int64_t r = m.league_rank();  // b T + t
        const int t = int(r % T);
        E* row = x + r * ld;
        const double p = double(pos0) + double(t);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, half), [&](int i) {
          const double angle = p * kmath::pow(base, -2.0 * double(i) / double(hs));
          const float c = float(kmath::cos(angle)), s = sign * float(kmath::sin(angle));
          for (int h = 0; h < heads; ++h) {
            E* v = row + std::int64_t(h) * hs + 2 * i;
            const float x0 = to_float(v[0]), x1 = to_float(v[1]);
            v[0] = from_float<E>(x0 * c - x1 * s);
            v[1] = from_float<E>(x0 * s + x1 * c);
          }
        });
      });
}

}  // namespace

void rope_forward(core::Ptr x, int B, int T, std::int64_t ld, int heads, int hs, int pos0, float theta) {
  STRATA_BY_FORMAT(x, rope_rotate("strata::rope_forward", x.as<E>(), B, T, ld, heads, hs, pos0, theta, 1.0f));
}

void rope_backward(core::Ptr dx, int B, int T, std::int64_t ld, int heads, int hs, int pos0, float theta) {
  STRATA_BY_FORMAT(dx, rope_rotate("strata::rope_backward", dx.as<E>(), B, T, ld, heads, hs, pos0, theta, -1.0f));
}

}  // namespace strata::kernels::kokkos
