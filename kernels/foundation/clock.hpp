// The profiling clock: monotonic seconds since the run began. clock_gettime
// on CLOCK_MONOTONIC is a vDSO call (tens of nanoseconds), cheap enough to
// stamp every layer's forward and backward.
#pragma once

#include <time.h>

#include <string>

namespace strata::prof {

// "850 ms", "42.1 s", "3m07s", "2h05m"; "?" for a negative or unknown time.
std::string format_duration(double seconds);

inline double now_seconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// The best rate of `reps` timed calls of run() (after one untimed warm-up
// call), each doing `work` units and returning when they are done: a GEMM's
// FLOP/s, for instance.
template <class Run>
double best_rate(double work, int reps, Run&& run) {
  run();
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_seconds();
    run();
    const double dt = now_seconds() - t0;
    if (work / dt > best) best = work / dt;
  }
  return best;
}

}  // namespace strata::prof
