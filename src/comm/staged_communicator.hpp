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

  void all_reduce(void* buf, std::int64_t count, DType t, ReduceOp op) override;
  void reduce_scatter(const void* send, void* recv, std::int64_t recv_count, DType t, ReduceOp op) override;
  void all_gather(const void* send, void* recv, std::int64_t send_count, DType t) override;
  void broadcast(void* buf, std::int64_t count, DType t, int root) override;
  void all_to_all(const void* send, void* recv, std::int64_t count_per_peer, DType t) override;
  void all_to_allv(const void* send, const std::int64_t* send_counts, const std::int64_t* send_displs, void* recv,
                   const std::int64_t* recv_counts, const std::int64_t* recv_displs, DType t) override;
  void send(const void* buf, std::int64_t count, DType t, int peer, int tag) override;
  void recv(void* buf, std::int64_t count, DType t, int peer, int tag) override;
  void probe(int peer, int tag) override;
  void barrier() override;

  RequestPtr iall_reduce(void* buf, std::int64_t count, DType t, ReduceOp op) override;
  RequestPtr ireduce_scatter(const void* send, void* recv, std::int64_t recv_count, DType t, ReduceOp op) override;
  RequestPtr iall_gather(const void* send, void* recv, std::int64_t send_count, DType t) override;
  RequestPtr ibroadcast(void* buf, std::int64_t count, DType t, int root) override;
  RequestPtr isend(const void* buf, std::int64_t count, DType t, int peer, int tag) override;
  RequestPtr irecv(void* buf, std::int64_t count, DType t, int peer, int tag) override;

 private:
  std::unique_ptr<Communicator> inner_;
  // Staging for blocking calls: one buffer per side of a call.
  std::vector<std::byte> in_, out_;
};

}  // namespace strata::comm
