// The NCCL implementation of the communicator, for device buffers: one NCCL
// communicator per mesh axis, made from that axis's MPI communicator (not
// owned, as for MpiCommunicator) and run on a communication stream of its
// own, so that communication overlaps the computation on the compute stream
// (the legacy default stream, where every kernel of the program runs).
// Built only with the CUDA backend; the process must have chosen its GPU
// (cudaSetDevice) before constructing one.
//
// Ordering. Every operation first makes the communication stream wait for
// what the compute stream has been given so far (an event recorded there),
// so the buffers hold their values; then the NCCL call goes on the
// communication stream, followed by a completion event. Blocking calls wait
// on the host for that event, so they are complete when they return, as the
// MPI ones are (and the profiling decorator times what it should). A
// non-blocking call's request tests that event; its wait() also makes the
// compute stream wait on it and then waits on the host, so after wait() the
// result is there for both the host and later kernels, as with MPI.
//
// Host buffers. The trainer reduces host scalars (a loss, a squared gradient
// norm) through the same communicators: a call whose buffers are in host
// memory goes to an MpiCommunicator on the same MPI communicator instead.
// Which path a call takes is decided on each rank from its own buffers, so
// all ranks of a collective must pass the same kind of memory (null pointers,
// as a rank with nothing to move may pass, count as host). A call mixing host
// and device buffers is refused.
//
// Point-to-point. NCCL has no tags (messages between two ranks match in the
// order they were posted) and no probe: probe() returns at once, so a
// profiled recv records no peer_wait and its whole wait counts as transfer.
// NCCL runs the operations of one communicator in order, and a send or
// receive holds the stream until the peer posts its side; posting MPI-style
// isend / irecv pairs one by one would then deadlock in patterns that are
// fine under MPI (each rank of a pair sending before it receives, as the
// pipeline schedules do). So isend and irecv are deferred: they are launched
// together as one NCCL group, with the call that launches them, by the next
// blocking send or recv (which joins the group), by any other operation on
// this communicator (launched as a group of their own, before it), by wait()
// on one of their requests, or by start_pending(). Until then test() on their
// requests returns false without launching them: poll with wait(), or call
// start_pending() first. A blocking send completes when the peer has
// received it (a rendezvous, as MPI's synchronous send).
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/foundation/communicator.hpp"
#include "src/comm/mpi_communicator.hpp"

namespace strata::comm {

ncclDataType_t nccl_datatype(DType t);
ncclRedOp_t nccl_op(ReduceOp op);

namespace detail {
struct NcclCompletion;
struct NcclPending;
struct NcclOrigin;
}  // namespace detail

// "NCCL 2.27.3" (the library's, as loaded).
std::string nccl_version();

class NcclCommunicator : public Communicator {
 public:
  // Collective over `comm`, which stays owned by the caller and must outlive
  // this object. Throws (on every rank alike where it can) when a rank has no
  // usable GPU or NCCL cannot set up the communicator.
  NcclCommunicator(MPI_Comm comm, std::string axis);
  // Waits for the operations in flight, then ncclCommDestroy (every rank of
  // the communicator must destroy it, in the same order as its other
  // communicators). While an exception unwinds the stack, ncclCommAbort
  // instead: the peers may never come. Uses no MPI, so it is safe before
  // MPI_Finalize. Operations still deferred are never launched (said on
  // stderr); waiting on their requests afterwards throws.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return mpi_.rank(); }
  int size() const override { return mpi_.size(); }
  const std::string& axis() const override { return mpi_.axis(); }

#define STRATA_COMM_OP(ret, name, params) ret name params override;
#include "kernels/foundation/comm_ops.inc"
#undef STRATA_COMM_OP

  // Launches the deferred isend / irecv operations now, as one group.
  void start_pending();

  bool last_device_span(double* start, double* end) const override;

 private:
  struct P2p {
    bool is_send;
    void* buf;
    std::size_t count;
    ncclDataType_t type;
    int peer;
  };
  struct Deferred {
    P2p op;
    std::shared_ptr<detail::NcclPending> state;  // shared with its request
  };

  // Orders the communication stream after the compute stream's work so far,
  // launching the deferred operations first (they were issued earlier), and
  // records the operation's start.
  void begin();
  void wait_for_compute();
  // After the NCCL call(s) of a blocking operation: waits for them.
  void finish_blocking();
  // After the NCCL call(s) of a non-blocking one: its request.
  RequestPtr finish_nonblocking();
  RequestPtr defer(const P2p& op);
  // Whether the call's buffers are on the device; throws if they are mixed.
  bool on_device(const char* call, const void* a, const void* b = nullptr) const;
  // Frees what was made, aborting NCCL's communicator rather than waiting
  // for it if `abort`; for the destructor and a constructor that failed.
  void release(bool abort) noexcept;

  // Timing from the stream's own events, read once an operation completed:
  // an origin event recorded and waited for while the host read the
  // profiling clock (at construction, and again when the stream is idle and
  // the last one is over `kReanchor` old: the GPU's and the host's clocks
  // drift, and a float of milliseconds since an old origin loses
  // precision); each operation's start event is recorded before its NCCL
  // call(s), its completion event after. Completions share the origin.
  cudaEvent_t record_start();
  std::shared_ptr<detail::NcclCompletion> complete_after(cudaEvent_t start);
  void anchor();
  // Keeps the span of a blocking operation for last_device_span().
  void keep_span(const Request& r);
  std::shared_ptr<detail::NcclOrigin> origin_;
  bool last_on_device_ = false;  // the last blocking call ran here (not on MPI)
  double last_start_ = 0, last_end_ = 0;

  MpiCommunicator mpi_;  // for host buffers
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // recorded on the compute stream
  cudaEvent_t next_start_ = nullptr;  // begin()'s, taken by the operation's completion
  float* scratch_ = nullptr;     // one device float, for barrier()
  std::vector<Deferred> pending_;
};

}  // namespace strata::comm
