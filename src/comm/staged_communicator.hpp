// A decorator that lets a host-only communicator (MPI that is not
// CUDA-aware, as Debian's MPICH is not) move device buffers: backend.comm =
// "mpi" with the CUDA backend. Each device buffer of a call is copied to host
// memory (cudaMemcpy, which waits for the kernels before it on the legacy
// default stream), the wrapped call runs on the host copies, and what it
// wrote is copied back. Host buffers pass straight through; buffers are
// classified one by one (is_device_memory), so a call may mix the two.
// Built only with the CUDA backend.
//
// Blocking calls reuse staging buffers held here (grown as needed). A
// non-blocking call stages into buffers its request owns, and copies the
// result back when wait() returns, or when test() first reports completion:
// only then does the device buffer hold it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "kernels/foundation/communicator.hpp"

namespace strata::comm {

class HostStagedCommunicator : public Communicator {
 public:
  explicit HostStagedCommunicator(std::unique_ptr<Communicator> inner);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& axis() const override { return inner_->axis(); }
  Communicator& inner() { return *inner_; }

#define STRATA_COMM_OP(ret, name, params) ret name params override;
#include "kernels/foundation/comm_ops.inc"
#undef STRATA_COMM_OP

 private:
  std::unique_ptr<Communicator> inner_;
  // Staging for blocking calls: one buffer per side of a call.
  std::vector<std::byte> in_, out_;
};

}  // namespace strata::comm
