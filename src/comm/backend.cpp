#include "src/comm/backend.hpp"

#include <algorithm>

#include "kernels/foundation/error.hpp"
#include "kernels/foundation/module.hpp"
#include "src/comm/cuda_comm.hpp"
#include "src/comm/mpi_communicator.hpp"

namespace strata::comm {

namespace {

// The CUDA module's communicators, loaded on the first call (cuda_comm.hpp).
const CudaComm& cuda_comm() {
  static const CudaComm& table = core::module_table<CudaComm>("cuda_comm", kCudaCommEntry, kCudaCommAbi);
  return table;
}

}  // namespace

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
  if (b == Backend::nccl) out += "; " + cuda_comm().nccl_version();
  return out;
}

bool backend_built(Backend b) { return b == Backend::mpi || b == Backend::meta || STRATA_HAVE_CUDA; }

std::unique_ptr<Communicator> make_communicator(Backend b, MPI_Comm comm, const std::string& axis) {
  if (!backend_built(b))
    core::runtime_error("communicator backend \"{}\" needs the CUDA backend, which this build lacks (configure with "
                        "-DSTRATA_WITH_CUDA=ON, or AUTO where nvcc is found)",
                        describe_backend(b));
  STRATA_CHECK(b != Backend::meta, "meta communicators come from the meta mesh, not from an MPI communicator");
  if (b == Backend::nccl) return cuda_comm().make_nccl(comm, axis);
  if (b == Backend::mpi_staged) return cuda_comm().make_staged(std::make_unique<MpiCommunicator>(comm, axis));
  return std::make_unique<MpiCommunicator>(comm, axis);
}

}  // namespace strata::comm
