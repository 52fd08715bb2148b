// This process's rank and the world's size, and a private copy of the world,
// for the MPI tests.
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

// A private copy of the world that returns error codes, as the Mesh makes.
struct DupWorld {
  MPI_Comm c = MPI_COMM_NULL;
  DupWorld() {
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  }
  ~DupWorld() { MPI_Comm_free(&c); }
};

}  // namespace strata::mpi_test
