// The process mesh: world = pp x dp x tp with tp varying fastest (tensor
// parallel ranks are neighbours, so they share a node), then dp, then pp.
// One function maps a rank to its coordinates and back; the Mesh builds one
// communicator per axis with MPI_Comm_split, each wrapped in the profiling
// layer so every call on any axis is recorded.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "src/comm/comm_log.hpp"
#include "src/comm/communicator.hpp"

namespace strata::mesh {

struct Layout {
  int pp = 1, dp = 1, tp = 1;
  int world() const { return pp * dp * tp; }
};

struct Coords {
  int pp = 0, dp = 0, tp = 0;
};

Coords coords_of(const Layout& l, int rank);
int rank_of(const Layout& l, const Coords& c);

class Mesh {
 public:
  // Collective over `world`. Requires l.world() == size of `world` (checked:
  // runtime error naming the constraint). Every axis communicator records
  // its calls into `log`.
  Mesh(MPI_Comm world, const Layout& l, comm::CommLog& log);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  const Layout& layout() const { return layout_; }
  const Coords& coords() const { return coords_; }
  int rank() const { return rank_; }

  comm::Communicator& world() { return *world_; }
  comm::Communicator& dp() { return *dp_; }
  comm::Communicator& tp() { return *tp_; }
  comm::Communicator& pp() { return *pp_; }
  // The first and last pipeline stages of this rank's (dp, tp) position,
  // which both hold the tied word embedding; null on the other stages.
  comm::Communicator* embedding() { return emb_.get(); }

  // Collective. The table --dry-run prints: one line per rank with its host,
  // coordinates and the world ranks of each group it belongs to. Every rank
  // gets the same text.
  std::string table() const;

 private:
  Layout layout_;
  Coords coords_;
  int rank_ = 0;
  MPI_Comm world_comm_ = MPI_COMM_NULL, dp_comm_ = MPI_COMM_NULL, tp_comm_ = MPI_COMM_NULL, pp_comm_ = MPI_COMM_NULL,
           emb_comm_ = MPI_COMM_NULL;
  std::unique_ptr<comm::Communicator> world_, dp_, tp_, pp_, emb_;
};

}  // namespace strata::mesh
