// Rotary position embedding (RoFormer), in place on the query and key heads
// of a qkv buffer (kernels/ops.inc states the contract). One thread per
// (row, pair i): a row's angles depend on its position only, so the thread
// takes pair i's angle once, in double and then rounded, as the CPU backend
// does (kernels/cpu/rope.cpp), and turns pair i of every head of the row by
// it, instead of one thread per head each taking the same angle again.
// Consecutive threads hold consecutive pairs of a head, so a head's reads
// and writes are coalesced. An odd head size leaves its last element as it
// is (hs / 2 pairs), as on the CPU.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/launch.cuh"

namespace strata::kernels::cuda {

namespace {

// sign +1 turns each pair forward by its angle, -1 back (the backward: the
// rotation is orthogonal, its inverse its transpose).
template <typename E>
void rope(E* x, int B, int T, std::int64_t ld, int heads, int hs, int pos0, float theta, float sign) {
  const int pairs = hs / 2;
  if (B <= 0 || T <= 0 || heads <= 0 || pairs <= 0) return;
  launch(std::int64_t(B) * T * pairs, [=] __device__(std::int64_t e) {
    const std::int64_t row = e / pairs;  // b T + t
    const int i = int(e % pairs), t = int(row % T);
    const double angle = double(pos0 + t) * pow(double(theta), -2.0 * i / hs);
    double sn = 0, cs = 0;
    sincos(angle, &sn, &cs);
    const float c = float(cs), s = sign * float(sn);
    E* v = x + row * ld + 2 * i;
    for (int h = 0; h < heads; ++h, v += hs) {
      const float a = to_float(v[0]), d = to_float(v[1]);
      v[0] = from_float<E>(a * c - d * s);
      v[1] = from_float<E>(a * s + d * c);
    }
  });
}

}  // namespace

void rope_forward(core::Ptr x, int B, int T, std::int64_t ld, int heads, int hs, int pos0, float theta) {
  STRATA_BY_FORMAT(x, rope(x.as<E>(), B, T, ld, heads, hs, pos0, theta, 1.0f));
}

void rope_backward(core::Ptr dx, int B, int T, std::int64_t ld, int heads, int hs, int pos0, float theta) {
  STRATA_BY_FORMAT(dx, rope(dx.as<E>(), B, T, ld, heads, hs, pos0, theta, -1.0f));
}

}  // namespace strata::kernels::cuda
