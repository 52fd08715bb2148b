// Activations and their gradients on their way between ranks: in the
// compute precision. The kernels compute and keep activations in fp32; under
// bf16 or fp16 a tensor- or sequence-parallel collective, a ring attention
// block, a pipeline transfer or an expert exchange rounds its fp32 values to
// the 16-bit format, moves 2 bytes an element (what Megatron-LM moves, whose
// activations are 16-bit), and widens what arrives back to fp32. A sum over
// ranks is taken in fp32 and rounded once per pairwise combination (the
// communicator's 16-bit sum), so the wire costs one rounding of each value
// sent, as a 16-bit activation would. Under fp32 every call passes its
// buffers straight through.
//
// The 16-bit copies are the communication category's memory, allocated on
// the run's tracker for the call (or, non-blocking, until the request
// completes): the dry run on the meta device allocates and records the same.
#pragma once

#include <cstdint>

#include "kernels/foundation/communicator.hpp"
#include "kernels/foundation/memory.hpp"
#include "kernels/foundation/precision.hpp"

namespace strata::models {

class Wire {
 public:
  Wire() = default;  // fp32
  Wire(core::MemoryTracker& tracker, core::Precision p);

  core::Precision precision() const { return p_; }
  bool half() const { return p_ != core::Precision::fp32; }

  // x[n] summed over c's ranks in place.
  void all_reduce(comm::Communicator& c, float* x, std::int64_t n) const;
  // all[size * count] from every rank's mine[count] (mine may be
  // all + rank * count).
  void all_gather(comm::Communicator& c, const float* mine, float* all, std::int64_t count) const;
  // This rank's block of recv_count of the sum over ranks of send[size * recv_count].
  void reduce_scatter(comm::Communicator& c, const float* send, float* recv, std::int64_t recv_count) const;
  // Communicator::all_to_allv's blocks, in elements, of buffers of `extent`
  // elements each: the copies are that size, so that the memory an exchange
  // takes does not depend on how many elements the blocks hold this time.
  void all_to_allv(comm::Communicator& c, const float* send, const std::int64_t* send_counts,
                   const std::int64_t* send_displs, float* recv, const std::int64_t* recv_counts,
                   const std::int64_t* recv_displs, std::int64_t extent) const;
  void recv(comm::Communicator& c, float* y, std::int64_t n, int peer, int tag) const;
  // Non-blocking: the request holds the 16-bit copy (freed with the request,
  // so at a point of the program, not of the peer's timing); a receive widens
  // into y when it is found complete (wait, or a test that returns true).
  // `held`: a copy of n elements the caller keeps until the request is
  // done (else the request holds one).
  comm::RequestPtr isend(comm::Communicator& c, const float* x, std::int64_t n, int peer, int tag,
                         std::uint16_t* held = nullptr) const;
  comm::RequestPtr irecv(comm::Communicator& c, float* y, std::int64_t n, int peer, int tag) const;
  // n elements of the communication category for a 16-bit copy.
  core::Buffer<std::uint16_t> copy(std::int64_t n) const;

 private:
  comm::DType dtype() const { return comm::dtype_of(p_); }

  core::MemoryTracker* tracker_ = nullptr;
  core::Precision p_ = core::Precision::fp32;
};

}  // namespace strata::models
