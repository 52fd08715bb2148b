// Which implementation carries a mesh's communication: MPI on host buffers,
// MPI with device buffers staged through host memory (for an MPI that is not
// CUDA-aware), or NCCL. The last two exist only in builds with the CUDA
// backend (STRATA_HAVE_CUDA); asking for them elsewhere is a runtime error
// naming the build option.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "kernels/foundation/communicator.hpp"

namespace strata::comm {

// meta: the dry run's communicators (meta_communicator.hpp), which move
// nothing; the mesh builds them without MPI.
enum class Backend { mpi, mpi_staged, nccl, meta };

// For the report: "mpi", "mpi (device buffers staged through host memory)", "nccl".
std::string describe_backend(Backend b);
// The communication libraries' versions, for the report's provenance: the
// MPI library's first line, and NCCL's with the nccl backend.
std::string library_versions(Backend b);

// Whether this build has `b`.
bool backend_built(Backend b);

// The communicator of `b` on `comm` (not owned), unprofiled. Collective over
// `comm` for nccl. Throws a runtime error if the build lacks `b`.
std::unique_ptr<Communicator> make_communicator(Backend b, MPI_Comm comm, const std::string& axis);

}  // namespace strata::comm
