// The profiling clock: monotonic seconds since the run began. clock_gettime
// on CLOCK_MONOTONIC is a vDSO call (tens of nanoseconds), cheap enough to
// stamp every layer's forward and backward.
#pragma once

#include <time.h>

namespace strata::prof {

inline double now_seconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

}  // namespace strata::prof
