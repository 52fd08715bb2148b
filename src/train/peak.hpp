// The peak FLOP/s that MFU is measured against: from the deck
// (backend.peak_tflops), or measured at start-up as the best rate of a short
// square GEMM on the selected device (the CPU: sgemm on the threads the run
// uses; a GPU: cuBLAS at the run's precision, bf16 on tensor cores for
// mixed precision), and recorded as such.
#pragma once

#include <string>

#include "kernels/foundation/precision.hpp"

namespace strata::train {

struct Peak {
  double flops_per_s = 0;
  std::string source;  // "deck" or "measured: sgemm 1024^3, best of N"
};

Peak resolve_peak(double peak_tflops_from_deck, core::Precision precision);

}  // namespace strata::train
