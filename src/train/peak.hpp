// The peak FLOP/s that MFU is measured against, one figure per machine so
// that MFU compares across runs and sweep points. In order:
//   1. backend.peak_tflops (per device);
//   2. backend.machine: a machine description's device peak at the run's
//      precision (docs/machines.md; `strata calibrate` writes one);
//   3. a figure measured once per host and kept in the peak cache: the best
//      rate of a short square GEMM on the selected device (the CPU: sgemm on
//      the threads a rank uses; a GPU: cuBLAS at the run's precision),
//      measured by one rank of the node while the others sleep, so that
//      ranks sharing cores do not halve it.
// The cache is a directory: $STRATA_PEAK_CACHE, else
// $XDG_CACHE_HOME/strata/peak, else ~/.cache/strata/peak; one file per host,
// backend, precision and thread count. Delete it to measure again.
#pragma once

#include <mpi.h>

#include <string>

#include "plan/plan.hpp"

namespace strata::train {

struct Peak {
  double flops_per_s = 0;  // per device (a rank)
  std::string source;      // what /summary/peak_source says: where the figure came from
};

// Collective over `comm`: every rank gets its node's figure (each node's
// lowest rank reads or measures it; the node's other ranks sleep meanwhile).
Peak resolve_peak(const plan::Plan& cfg, MPI_Comm comm);

// The cache directory, as above ("" when neither variable nor $HOME is set).
std::string peak_cache_dir();

}  // namespace strata::train
