// The process mesh: one communicator per group of a layout (its dims and
// groups are the registry rows', strategies/axes.hpp), of the chosen backend
// (MPI, MPI staging device buffers through host memory, or NCCL), each
// wrapped in the profiling layer so that every call on any axis is recorded
// under the group's name.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/foundation/communicator.hpp"
#include "src/comm/backend.hpp"
#include "src/comm/comm_log.hpp"
#include "strategies/axes.hpp"
#include "strategies/parallelize.hpp"

namespace strata::mesh {

class Mesh final : public strategies::MeshGroups {
 public:
  // Collective over `world`. Requires l.world() == size of `world` (checked:
  // runtime error naming the constraint). Every communicator records its
  // calls into `log`. `backend` carries them: a backend this build lacks
  // (nccl, mpi_staged without the CUDA backend) is a runtime error on every
  // rank; nccl needs each rank's GPU chosen (cudaSetDevice) beforehand.
  Mesh(MPI_Comm world, const Layout& l, comm::CommLog& log, comm::Backend backend = comm::Backend::mpi);
  // The mesh as world rank `rank` of layout `l` sees it, on the meta device
  // (a dry run, one process, no MPI): every group a MetaCommunicator of its
  // size in which this process plays the rank's part; calls are recorded
  // into `log` as a real rank's are.
  Mesh(const Layout& l, int rank, comm::CommLog& log);
  ~Mesh() override;
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  const Layout& layout() const { return layout_; }
  // This rank's coordinates, one per dim of the layout; one of them.
  const std::vector<int>& coords() const { return coords_; }
  int coord(std::string_view dim) const;
  int rank() const { return rank_; }
  comm::Backend backend() const { return backend_; }

  comm::Communicator& world() { return *axes_.front().group; }
  // The communicator of group `name` ("world" too); null where this rank
  // has no such group (a group that takes only some coordinates).
  comm::Communicator* group(std::string_view name) const override;
  // The same, for a group every rank has (an error otherwise).
  comm::Communicator& axis(std::string_view name) const;

  // Collective. The table --dry-run prints: one line per rank with its host,
  // coordinates and the world ranks of each group it belongs to. Every rank
  // gets the same text.
  std::string table() const;
  // The MPI communicator of a group (MPI_COMM_NULL where this rank has
  // none, or on the meta device).
  MPI_Comm mpi_comm(std::string_view axis) const;

 private:
  void release();
  struct Axis {
    std::string name;
    MPI_Comm comm = MPI_COMM_NULL;
    std::unique_ptr<comm::Communicator> group;
  };

  Layout layout_;
  comm::Backend backend_;
  std::vector<int> coords_;
  int rank_ = 0;
  std::vector<Axis> axes_;  // world first, then the layout's groups in order
};

}  // namespace strata::mesh
