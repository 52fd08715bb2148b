// The communicators' half of the CUDA module's entry points: the table
// backend.cpp calls through (cuda_comm.hpp).
#include "src/comm/cuda_comm.hpp"
#include "src/comm/nccl_communicator.hpp"
#include "src/comm/staged_communicator.hpp"

namespace {

strata::comm::CudaComm fill() {
  using namespace strata::comm;
  CudaComm t;
  t.abi = kCudaCommAbi;
  t.size = sizeof t;
  t.make_nccl = [](MPI_Comm comm, const std::string& axis) -> std::unique_ptr<Communicator> {
    return std::make_unique<NcclCommunicator>(comm, axis);
  };
  t.make_staged = [](std::unique_ptr<Communicator> inner) -> std::unique_ptr<Communicator> {
    return std::make_unique<HostStagedCommunicator>(std::move(inner));
  };
  t.nccl_version = &nccl_version;
  return t;
}

}  // namespace

extern "C" const strata::comm::CudaComm* strata_cuda_comm() {
  static const strata::comm::CudaComm table = fill();
  return &table;
}
