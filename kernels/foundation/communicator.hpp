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

#include "kernels/foundation/precision.hpp"
#include "kernels/foundation/ptr.hpp"

namespace strata::comm {

// bf16, f16: the 16-bit formats of mixed precision (kernels/foundation/precision.hpp);
// their sums are taken in fp32 and rounded once per pairwise combination.
enum class DType { f32, f64, i32, i64, bf16, f16 };
std::size_t dtype_size(DType t);
// The type that moves elements stored at precision p, and back (a
// floating-point type only).
DType dtype_of(core::Precision p);
core::Precision precision_of(DType t);
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

// What an implementation's destructor does with an unfinished request: waits
// for it (the contract), except while its rank unwinds from a failure. Then
// the peers may never join the operation, and a wait would hang the job
// instead of letting the failure be reported: the request is polled until a
// deadline shared by all of them (2 s after the first) and then abandoned
// (its buffers are the job's last concern: it is ending). A destructor cannot
// throw: errors are said on stderr, naming `what`.
void finish_in_destructor(Request& r, const char* what);

// The operations are listed once, in comm_ops.inc; an implementation's class
// declares them all by including it with
//   #define STRATA_COMM_OP(ret, name, params) ret name params override;
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& axis() const = 0;  // "world", "dp", "tp", "pp", ...

#define STRATA_COMM_OP(ret, name, params) virtual ret name params = 0;
#include "kernels/foundation/comm_ops.inc"
#undef STRATA_COMM_OP

  // Request::device_span for the last blocking call (false if it ran on the host).
  virtual bool last_device_span(double* start, double* end) const { return false; }
};

// n elements of a tensor to or from a peer, moved in the tensor's format.
inline RequestPtr isend(Communicator& c, core::CPtr x, std::int64_t n, int peer, int tag) {
  return c.isend(x.get(), n, dtype_of(x.precision()), peer, tag);
}
inline RequestPtr irecv(Communicator& c, core::Ptr y, std::int64_t n, int peer, int tag) {
  return c.irecv(y.get(), n, dtype_of(y.precision()), peer, tag);
}
inline void recv(Communicator& c, core::Ptr y, std::int64_t n, int peer, int tag) {
  c.recv(y.get(), n, dtype_of(y.precision()), peer, tag);
}

}  // namespace strata::comm

