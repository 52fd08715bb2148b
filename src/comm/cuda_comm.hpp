// The CUDA communicators' module (libstrata_cuda_comm.so): NCCL, and MPI
// with device buffers staged through host memory. backend.cpp reaches them
// through this table, so the harness links neither NCCL nor the CUDA runtime
// and a run on MPI never loads them (kernels/foundation/module.hpp). A module
// of its own, apart from the kernels' (libstrata_cuda.so), because it takes
// the MPI communicator from the program: a program of the kernel floor alone
// can load the kernels'. Plain C++.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>

#include "kernels/foundation/communicator.hpp"

namespace strata::comm {

// Changed with the table's layout (see kernels/cuda/backend_table.hpp).
inline constexpr int kCudaCommAbi = 1;

struct CudaComm {
  int abi = 0;
  std::size_t size = 0;
  // NcclCommunicator on `comm` (collective over it).
  std::unique_ptr<Communicator> (*make_nccl)(MPI_Comm comm, const std::string& axis) = nullptr;
  // HostStagedCommunicator around `inner`.
  std::unique_ptr<Communicator> (*make_staged)(std::unique_ptr<Communicator> inner) = nullptr;
  // "NCCL 2.28.3", for the report's provenance.
  std::string (*nccl_version)() = nullptr;
};

// The module's entry point: its table, filled (src/comm/cuda_module.cpp).
using CudaCommEntry = const CudaComm*();
inline constexpr const char* kCudaCommEntry = "strata_cuda_comm";

}  // namespace strata::comm
