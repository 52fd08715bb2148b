// The peak FLOP/s that MFU is measured against: from the deck
// (backend.peak_tflops), or measured at start-up as the best rate of a short
// square sgemm on the threads the run uses, and recorded as such.
#pragma once

#include <string>

namespace strata::train {

struct Peak {
  double flops_per_s = 0;
  std::string source;  // "deck" or "measured: sgemm 1024^3, best of N"
};

// Best FLOP/s of `reps` sgemms of size n x n x n.
double measure_sgemm_flops(int n, int reps);
Peak resolve_peak(double peak_tflops_from_deck);

}  // namespace strata::train
