// This process's rank and the world's size, a private copy of the world, and
// mesh layouts, for the MPI tests.
#pragma once

#include <mpi.h>

#include "strategies/registry.hpp"

namespace strata::mpi_test {

// The mesh layout of a plan with these sizes: the registry rows' dims and
// groups (pp x dp x cp x tp, ep and dp_shard cutting dp).
inline mesh::Layout grid(int pp, int dp, int tp, int ep = 1, int dp_shard = 0, int cp = 1) {
  plan::Plan p;
  p.parallel.pp = pp, p.parallel.dp = dp, p.parallel.tp = tp, p.parallel.ep = ep;
  p.parallel.dp_shard = dp_shard, p.parallel.cp = cp;
  return strategies::layout_of(p);
}

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
