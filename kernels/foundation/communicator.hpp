// The communicator interface: every collective and point-to-point transfer a
// strategy issues goes through it, on one axis of the mesh (world, dp, tp,
// pp). An MPI implementation (mpi_communicator.hpp) does the work; a
// profiling decorator (profiled_communicator.hpp) records every call, so that
// the report's /comm table sees all traffic. With the CUDA backend, an NCCL
// implementation (nccl_communicator.hpp) and a decorator that stages device
// buffers through host memory (staged_communicator.hpp) implement the same
// interface; backend.hpp chooses among them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace strata::comm {

// bf16, f16: the 16-bit formats of mixed precision (kernels/foundation/precision.hpp);
// their sums are taken in fp32 and rounded once per pairwise combination.
enum class DType { f32, f64, i32, i64, bf16, f16 };
std::size_t dtype_size(DType t);
enum class ReduceOp { sum, max, min };

// A non-blocking operation in flight. wait() blocks until it completes;
// test() polls (and drives progress). Destroying an unfinished request waits.
class Request {
 public:
  virtual ~Request() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
  // Where the operation ran on a device's stream (NCCL): its start and end
  // on the profiling clock (prof::now_seconds), read from the device's
  // events once it completed, without stalling anything. False where the
  // host's own times around the call are the operation's (MPI).
  virtual bool device_span(double* start, double* end) const { return false; }
};
using RequestPtr = std::unique_ptr<Request>;

// Counts are in elements. Buffers of "in place" operations are noted.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& axis() const = 0;  // "world", "dp", "tp", "pp", ...

  // buf[count] is reduced over the group in place.
  virtual void all_reduce(void* buf, std::int64_t count, DType t, ReduceOp op) = 0;
  // send[size() * recv_count] is reduced; rank r receives block r in recv[recv_count].
  virtual void reduce_scatter(const void* send, void* recv, std::int64_t recv_count, DType t, ReduceOp op) = 0;
  // recv[size() * send_count] = concatenation of every rank's send[send_count];
  // send may alias recv + rank() * send_count (in place).
  virtual void all_gather(const void* send, void* recv, std::int64_t send_count, DType t) = 0;
  virtual void broadcast(void* buf, std::int64_t count, DType t, int root) = 0;
  // Block p of send (count_per_peer elements) goes to rank p.
  virtual void all_to_all(const void* send, void* recv, std::int64_t count_per_peer, DType t) = 0;
  // Counts and displacements in elements, one per rank of the group.
  virtual void all_to_allv(const void* send, const std::int64_t* send_counts, const std::int64_t* send_displs,
                           void* recv, const std::int64_t* recv_counts, const std::int64_t* recv_displs,
                           DType t) = 0;
  virtual void send(const void* buf, std::int64_t count, DType t, int peer, int tag) = 0;
  virtual void recv(void* buf, std::int64_t count, DType t, int peer, int tag) = 0;
  // Blocks until a message from `peer` with `tag` has arrived (or, for a
  // large one, been announced), without receiving it: what a profiled recv
  // uses to tell waiting for the peer from the transfer itself.
  virtual void probe(int peer, int tag) = 0;
  virtual void barrier() = 0;

  // Non-blocking forms (MPI-3), so communication can overlap computation.
  virtual RequestPtr iall_reduce(void* buf, std::int64_t count, DType t, ReduceOp op) = 0;
  virtual RequestPtr ireduce_scatter(const void* send, void* recv, std::int64_t recv_count, DType t,
                                     ReduceOp op) = 0;
  virtual RequestPtr iall_gather(const void* send, void* recv, std::int64_t send_count, DType t) = 0;
  virtual RequestPtr ibroadcast(void* buf, std::int64_t count, DType t, int root) = 0;
  virtual RequestPtr isend(const void* buf, std::int64_t count, DType t, int peer, int tag) = 0;
  virtual RequestPtr irecv(void* buf, std::int64_t count, DType t, int peer, int tag) = 0;

  // Request::device_span for the last blocking call (false if it ran on the host).
  virtual bool last_device_span(double* start, double* end) const { return false; }
};

}  // namespace strata::comm
