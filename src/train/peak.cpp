#include "src/train/peak.hpp"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "kernels/kernels.hpp"
#include "src/prof/clock.hpp"

namespace strata::train {

double measure_sgemm_flops(int n, int reps) {
  std::vector<float> a(std::size_t(n) * n), b(std::size_t(n) * n), c(std::size_t(n) * n);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = float(i % 13) * 0.01f;
    b[i] = float(i % 7) * 0.02f;
  }
  kernels::matmul(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);  // warm-up
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const double t0 = prof::now_seconds();
    kernels::matmul(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double dt = prof::now_seconds() - t0;
    best = std::max(best, 2.0 * double(n) * n * n / dt);
  }
  return best;
}

Peak resolve_peak(double peak_tflops_from_deck) {
  if (peak_tflops_from_deck > 0) return {peak_tflops_from_deck * 1e12, "deck"};
  const int n = 1024, reps = 5;
  return {measure_sgemm_flops(n, reps), fmt::format("measured: sgemm {}^3, best of {}", n, reps)};
}

}  // namespace strata::train
