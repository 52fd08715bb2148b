#include "src/comm/backend.hpp"

#include <algorithm>

#include "src/comm/mpi_communicator.hpp"
#include "kernels/foundation/error.hpp"

#if STRATA_HAVE_CUDA
#include "src/comm/nccl_communicator.hpp"
#include "src/comm/staged_communicator.hpp"
#endif

namespace strata::comm {

std::string describe_backend(Backend b) {
  switch (b) {
    case Backend::mpi: return "mpi";
    case Backend::mpi_staged: return "mpi (device buffers staged through host memory)";
    case Backend::nccl: return "nccl";
    case Backend::meta: return "meta (a dry run: nothing moves)";
  }
  STRATA_CHECK(false, "unknown Backend {}", int(b));
  return "";
}

std::string library_versions(Backend b) {
  char v[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(v, &len);
  std::string out(v, std::size_t(std::max(len, 0)));
  if (const auto nl = out.find('\n'); nl != std::string::npos) out.resize(nl);
  std::replace(out.begin(), out.end(), '\t', ' ');
#if STRATA_HAVE_CUDA
  if (b == Backend::nccl) out += "; " + nccl_version();
#endif
  return out;
}

bool backend_built(Backend b) { return b == Backend::mpi || b == Backend::meta || STRATA_HAVE_CUDA; }

std::unique_ptr<Communicator> make_communicator(Backend b, MPI_Comm comm, const std::string& axis) {
  if (!backend_built(b))
    core::runtime_error("communicator backend \"{}\" needs the CUDA backend, which this build lacks (configure with "
                        "-DSTRATA_WITH_CUDA=ON, or AUTO where nvcc is found)",
                        describe_backend(b));
  STRATA_CHECK(b != Backend::meta, "meta communicators come from the meta mesh, not from an MPI communicator");
#if STRATA_HAVE_CUDA
  if (b == Backend::nccl) return std::make_unique<NcclCommunicator>(comm, axis);
  if (b == Backend::mpi_staged)
    return std::make_unique<HostStagedCommunicator>(std::make_unique<MpiCommunicator>(comm, axis));
#endif
  return std::make_unique<MpiCommunicator>(comm, axis);
}

}  // namespace strata::comm
