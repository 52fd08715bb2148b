// This process's rank and the world's size, for the MPI tests.
#pragma once

#include <mpi.h>

namespace strata::mpi_test {

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

}  // namespace strata::mpi_test
