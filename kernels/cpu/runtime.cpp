// Thread control for the CPU backend: OpenMP loops and OpenBLAS share one
// thread count, set once by the caller (one MPI rank usually owns a few cores).
#include <cblas.h>
#include <omp.h>

#include <string>

#include "kernels/kernels.hpp"

namespace strata::kernels {

void set_num_threads(int n) {
  if (n < 1) n = 1;
  omp_set_num_threads(n);
  // The OpenMP build of OpenBLAS keeps its own count; without this it would
  // still use every core of the node and oversubscribe co-located ranks.
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

std::string cpu_blas_version() { return openblas_get_config(); }


}  // namespace strata::kernels
