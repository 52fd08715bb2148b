// NcclCommunicator: the interface's calls on NCCL for device buffers, on MPI
// for host buffers. See the header for the ordering and the deferred
// point-to-point operations.
#include "src/comm/nccl_communicator.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <utility>

#include "src/comm/cuda_support.hpp"
#include "src/comm/mpi_check.hpp"
#include "kernels/foundation/error.hpp"
#include "kernels/foundation/clock.hpp"

namespace strata::comm {

namespace {

[[noreturn]] void nccl_failed(const char* expr, ncclResult_t rc, const char* file, int line) {
  // NCCL's last error often says more than the code (which rank, which GPU).
  const char* detail = ncclGetLastError(nullptr);
  core::runtime_error("NCCL call `{}` failed at {}:{}: {} (code {}){}", expr, file, line, ncclGetErrorString(rc),
                      int(rc), detail != nullptr && *detail != '\0' ? fmt::format(": {}", detail) : std::string());
}

}  // namespace

}  // namespace strata::comm

#define STRATA_CHECK_NCCL(expr)                                                     \
  do {                                                                              \
    const ncclResult_t strata_nccl_rc_ = (expr);                                    \
    if (strata_nccl_rc_ != ncclSuccess)                                             \
      ::strata::comm::nccl_failed(#expr, strata_nccl_rc_, __FILE__, __LINE__);      \
  } while (0)

namespace strata::comm {

// The compute stream: the legacy default stream, named explicitly so that it
// means the same whatever this file's default-stream setting; recording on it
// also covers work on per-thread default streams, which it synchronises with.
const cudaStream_t kComputeStream = cudaStreamLegacy;

namespace detail {

// An event on the communication stream and the profiling clock's reading
// when it completed: what device times are measured from.
struct NcclOrigin {
  cudaEvent_t event = nullptr;
  double host = 0;
  NcclOrigin() = default;
  NcclOrigin(const NcclOrigin&) = delete;
  NcclOrigin& operator=(const NcclOrigin&) = delete;
  ~NcclOrigin() {
    if (event != nullptr) cudaEventDestroy(event);  // best effort: may run at exit
  }
};

// The completion event of one launch, shared by the requests it completes,
// with its start event and the origin for the timing (shared: a request may
// outlive its communicator).
struct NcclCompletion {
  cudaEvent_t event = nullptr, start = nullptr;
  std::shared_ptr<NcclOrigin> origin;
  NcclCompletion() = default;
  NcclCompletion(const NcclCompletion&) = delete;
  NcclCompletion& operator=(const NcclCompletion&) = delete;
  ~NcclCompletion() {
    if (event != nullptr) cudaEventDestroy(event);  // best effort: may run at exit
    if (start != nullptr) cudaEventDestroy(start);
  }
  // The start and end on the profiling clock; only once `event` completed.
  // The duration is measured between the operation's own two events (a
  // short interval, exact in a float of milliseconds), its start from the
  // origin.
  bool span(double* s, double* e) const {
    float from_origin = 0, duration = 0;
    if (start == nullptr || origin == nullptr ||
        cudaEventElapsedTime(&from_origin, origin->event, start) != cudaSuccess ||
        cudaEventElapsedTime(&duration, start, event) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    *s = origin->host + 1e-3 * double(from_origin);
    *e = *s + 1e-3 * double(duration);
    return true;
  }
};

// A request's operation: `done` once launched; until then `owner` holds it
// deferred (null if the owner went away or failed to launch it).
struct NcclPending {
  std::shared_ptr<NcclCompletion> done;
  NcclCommunicator* owner = nullptr;
};

}  // namespace detail

namespace {

using detail::NcclCompletion;
using detail::NcclOrigin;
using detail::NcclPending;

// An origin older than this is renewed when the stream is next idle.
constexpr double kReanchor = 30.0;

std::size_t to_count(std::int64_t n, const char* call, const char* what) {
  if (n < 0) core::runtime_error("{}: {} {} is negative", call, what, n);
  return std::size_t(n);
}

// Complete for the compute stream and for the host: the stream wait is what
// later kernels need, the host wait what MPI's semantics promise.
void wait_completion(const NcclCompletion& c) {
  STRATA_COMM_CHECK_CUDA(cudaStreamWaitEvent(kComputeStream, c.event, 0));
  STRATA_COMM_CHECK_CUDA(cudaEventSynchronize(c.event));
}

// The first failing call of a group: the group is always closed, even when
// a call in it failed, so NCCL is not left inside an open group.
struct FirstFailure {
  const char* call = nullptr;
  ncclResult_t rc = ncclSuccess;
  void operator()(const char* c, ncclResult_t r) {
    if (r != ncclSuccess && call == nullptr) call = c, rc = r;
  }
};

template <typename F>
void in_group(F&& post) {
  STRATA_CHECK_NCCL(ncclGroupStart());
  FirstFailure failed;
  post(failed);
  const ncclResult_t end = ncclGroupEnd();
  if (failed.call != nullptr) nccl_failed(failed.call, failed.rc, __FILE__, __LINE__);
  if (end != ncclSuccess) nccl_failed("ncclGroupEnd()", end, __FILE__, __LINE__);
}

class NcclRequest : public Request {
 public:
  explicit NcclRequest(std::shared_ptr<NcclPending> s) : s_(std::move(s)) {}
  NcclRequest(const NcclRequest&) = delete;
  NcclRequest& operator=(const NcclRequest&) = delete;

  ~NcclRequest() override {
    if (finished_) return;
    finish_in_destructor(*this, "NCCL request");
  }

  void wait() override {
    if (finished_) return;
    if (!s_->done) {
      if (s_->owner == nullptr)
        core::runtime_error("NCCL request: its communicator was destroyed, or failed to launch it, before it ran");
      s_->owner->start_pending();
    }
    wait_completion(*s_->done);
    finished_ = true;
  }

  bool test() override {
    if (finished_) return true;
    if (!s_->done) return false;  // deferred: not launched by test() (see the header)
    const cudaError_t rc = cudaEventQuery(s_->done->event);
    if (rc == cudaErrorNotReady) {
      cudaGetLastError();  // "not ready" is no error; do not leave it for a later check
      return false;
    }
    STRATA_COMM_CHECK_CUDA(rc);
    finished_ = true;
    return true;
  }

  bool device_span(double* start, double* end) const override {
    return finished_ && s_->done && s_->done->span(start, end);
  }

 private:
  std::shared_ptr<NcclPending> s_;
  bool finished_ = false;
};

}  // namespace

ncclDataType_t nccl_datatype(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
  }
  STRATA_CHECK(false, "unknown DType {}", int(t));
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  STRATA_CHECK(false, "unknown ReduceOp {}", int(op));
  return ncclSum;
}

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "NCCL (version unknown)";
  return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

NcclCommunicator::NcclCommunicator(MPI_Comm comm, std::string axis) : mpi_(comm, std::move(axis)) {
  try {
    // The local set-up first, agreed over the axis: a rank without a usable
    // GPU makes every rank throw here rather than leave the others waiting
    // in NCCL's initialisation.
    std::string local_error;
    try {
      int device = -1;
      STRATA_COMM_CHECK_CUDA(cudaGetDevice(&device));
      STRATA_COMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      STRATA_COMM_CHECK_CUDA(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
      anchor();
      STRATA_COMM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&scratch_), sizeof(float)));
      STRATA_COMM_CHECK_CUDA(cudaMemset(scratch_, 0, sizeof(float)));
    } catch (const core::Error& e) {
      local_error = e.what();
    }
    int ok = local_error.empty() ? 1 : 0, all_ok = 0;
    STRATA_CHECK_MPI(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, mpi_.comm()));
    if (!ok) core::runtime_error("NCCL communicator '{}': {}", this->axis(), local_error);
    if (!all_ok)
      core::runtime_error("NCCL communicator '{}': another rank of the axis has no usable GPU", this->axis());

    // Rank 0's unique id, with whether it got one, so that a failure there
    // is an error on every rank and not a hang in ncclCommInitRank.
    struct Boot {
      int ok;
      ncclUniqueId id;
    } boot{};
    ncclResult_t id_rc = ncclSuccess;
    if (rank() == 0) {
      id_rc = ncclGetUniqueId(&boot.id);
      boot.ok = id_rc == ncclSuccess ? 1 : 0;
    }
    STRATA_CHECK_MPI(MPI_Bcast(&boot, int(sizeof boot), MPI_BYTE, 0, mpi_.comm()));
    if (id_rc != ncclSuccess) nccl_failed("ncclGetUniqueId(&boot.id)", id_rc, __FILE__, __LINE__);
    if (!boot.ok)
      core::runtime_error("NCCL communicator '{}': rank 0 of the axis could not create NCCL's unique id",
                          this->axis());
    STRATA_CHECK_NCCL(ncclCommInitRank(&comm_, size(), boot.id, rank()));
  } catch (...) {
    release(false);  // the destructor does not run for a half-built object
    throw;
  }
}

NcclCommunicator::~NcclCommunicator() {
  if (!pending_.empty())
    std::fprintf(stderr, "strata: NCCL communicator '%s' destroyed with %zu deferred send/recv never launched\n",
                 axis().c_str(), pending_.size());
  for (Deferred& d : pending_) d.state->owner = nullptr;
  pending_.clear();
  // While an exception unwinds the stack (a rank failed), the peers may
  // never reach the operations in flight, nor ncclCommDestroy (which waits
  // for the other ranks of the node): abort instead, so that the error gets
  // to the handler that ends the job rather than hanging here.
  release(std::uncaught_exceptions() > 0);
}

void NcclCommunicator::release(bool abort) noexcept {
  // Best effort, and silent about CUDA: this may run at exit, when the
  // runtime is already shutting down.
  if (comm_ != nullptr) {
    if (!abort && stream_ != nullptr) cudaStreamSynchronize(stream_);  // what is in flight finishes first
    const ncclResult_t rc = abort ? ncclCommAbort(comm_) : ncclCommDestroy(comm_);
    if (rc != ncclSuccess)
      std::fprintf(stderr, "strata: %s on '%s' failed: %s\n", abort ? "ncclCommAbort" : "ncclCommDestroy",
                   axis().c_str(), ncclGetErrorString(rc));
    comm_ = nullptr;
  }
  if (scratch_ != nullptr) cudaFree(scratch_);
  if (ready_ != nullptr) cudaEventDestroy(ready_);
  origin_.reset();
  if (next_start_ != nullptr) cudaEventDestroy(next_start_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  scratch_ = nullptr, ready_ = nullptr, stream_ = nullptr, next_start_ = nullptr;
  cudaGetLastError();
}

bool NcclCommunicator::on_device(const char* call, const void* a, const void* b) const {
  const bool da = is_device_memory(a), db = is_device_memory(b);
  const bool ha = a != nullptr && !da, hb = b != nullptr && !db;
  if ((da || db) && (ha || hb))
    core::runtime_error("{} on '{}': one buffer is in device memory and the other in host memory; NCCL needs both "
                        "on the device (MPI takes both on the host)",
                        call, axis());
  return da || db;
}

void NcclCommunicator::wait_for_compute() {
  STRATA_COMM_CHECK_CUDA(cudaEventRecord(ready_, kComputeStream));
  STRATA_COMM_CHECK_CUDA(cudaStreamWaitEvent(stream_, ready_, 0));
}

void NcclCommunicator::begin() {
  if (next_start_ != nullptr) {  // left by an operation that failed after its begin()
    cudaEventDestroy(next_start_);
    next_start_ = nullptr;
  }
  // A new origin, if the last is old and the stream idle (so that waiting
  // for the origin's event costs nothing).
  if (prof::now_seconds() - origin_->host > kReanchor && cudaStreamQuery(stream_) == cudaSuccess) anchor();
  cudaGetLastError();  // cudaStreamQuery's "not ready" is no error
  if (!pending_.empty())
    start_pending();  // waits for the compute stream itself
  else
    wait_for_compute();
  next_start_ = record_start();
}

void NcclCommunicator::anchor() {
  auto o = std::make_shared<NcclOrigin>();
  STRATA_COMM_CHECK_CUDA(cudaEventCreate(&o->event));
  STRATA_COMM_CHECK_CUDA(cudaEventRecord(o->event, stream_));
  STRATA_COMM_CHECK_CUDA(cudaEventSynchronize(o->event));
  o->host = prof::now_seconds();
  origin_ = std::move(o);
}

cudaEvent_t NcclCommunicator::record_start() {
  cudaEvent_t e = nullptr;
  STRATA_COMM_CHECK_CUDA(cudaEventCreate(&e));
  STRATA_COMM_CHECK_CUDA(cudaEventRecord(e, stream_));
  return e;
}

std::shared_ptr<NcclCompletion> NcclCommunicator::complete_after(cudaEvent_t start) {
  auto c = std::make_shared<NcclCompletion>();
  c->start = start;  // owned by the completion from here on
  c->origin = origin_;
  STRATA_COMM_CHECK_CUDA(cudaEventCreate(&c->event));
  STRATA_COMM_CHECK_CUDA(cudaEventRecord(c->event, stream_));
  return c;
}

void NcclCommunicator::keep_span(const Request& r) {
  last_on_device_ = r.device_span(&last_start_, &last_end_);
}

bool NcclCommunicator::last_device_span(double* start, double* end) const {
  if (!last_on_device_) return false;
  *start = last_start_, *end = last_end_;
  return true;
}

void NcclCommunicator::finish_blocking() {
  auto s = std::make_shared<NcclPending>();
  s->done = complete_after(std::exchange(next_start_, nullptr));
  NcclRequest r(std::move(s));
  r.wait();
  keep_span(r);
}

RequestPtr NcclCommunicator::finish_nonblocking() {
  auto s = std::make_shared<NcclPending>();
  s->done = complete_after(std::exchange(next_start_, nullptr));
  return std::make_unique<NcclRequest>(std::move(s));
}

void NcclCommunicator::start_pending() {
  if (pending_.empty()) return;
  // Taken out first: whatever fails below, nothing is launched twice, and
  // the requests of a failed launch say so when waited on.
  std::vector<Deferred> ops;
  ops.swap(pending_);
  for (Deferred& d : ops) d.state->owner = nullptr;
  wait_for_compute();
  cudaEvent_t start = record_start();
  in_group([&](FirstFailure& f) {
    for (const Deferred& d : ops) {
      const P2p& p = d.op;
      if (p.is_send)
        f("ncclSend", ncclSend(p.buf, p.count, p.type, p.peer, comm_, stream_));
      else
        f("ncclRecv", ncclRecv(p.buf, p.count, p.type, p.peer, comm_, stream_));
    }
  });
  const auto done = complete_after(start);
  for (Deferred& d : ops) d.state->done = done;
}

RequestPtr NcclCommunicator::defer(const P2p& op) {
  auto s = std::make_shared<NcclPending>();
  s->owner = this;
  pending_.push_back(Deferred{op, s});
  return std::make_unique<NcclRequest>(std::move(s));
}

// ---- blocking forms: the non-blocking ones, waited for ----

void NcclCommunicator::all_reduce(void* buf, std::int64_t count, DType t, ReduceOp op) {
  last_on_device_ = false;
  if (!on_device("all_reduce", buf)) return mpi_.all_reduce(buf, count, t, op);
  const RequestPtr r = iall_reduce(buf, count, t, op);
  r->wait();
  keep_span(*r);
}

void NcclCommunicator::reduce_scatter(const void* send, void* recv, std::int64_t recv_count, DType t, ReduceOp op) {
  last_on_device_ = false;
  if (!on_device("reduce_scatter", send, recv)) return mpi_.reduce_scatter(send, recv, recv_count, t, op);
  const RequestPtr r = ireduce_scatter(send, recv, recv_count, t, op);
  r->wait();
  keep_span(*r);
}

void NcclCommunicator::all_gather(const void* send, void* recv, std::int64_t send_count, DType t) {
  last_on_device_ = false;
  if (!on_device("all_gather", send, recv)) return mpi_.all_gather(send, recv, send_count, t);
  const RequestPtr r = iall_gather(send, recv, send_count, t);
  r->wait();
  keep_span(*r);
}

void NcclCommunicator::broadcast(void* buf, std::int64_t count, DType t, int root) {
  last_on_device_ = false;
  if (!on_device("broadcast", buf)) return mpi_.broadcast(buf, count, t, root);
  const RequestPtr r = ibroadcast(buf, count, t, root);
  r->wait();
  keep_span(*r);
}

// A blocking send or recv launches the deferred operations with itself, as
// one group: see the header for why.
void NcclCommunicator::send(const void* buf, std::int64_t count, DType t, int peer, int tag) {
  last_on_device_ = false;
  if (!on_device("send", buf)) return mpi_.send(buf, count, t, peer, tag);
  const RequestPtr r = isend(buf, count, t, peer, tag);
  r->wait();
  keep_span(*r);
}

void NcclCommunicator::recv(void* buf, std::int64_t count, DType t, int peer, int tag) {
  last_on_device_ = false;
  if (!on_device("recv", buf)) return mpi_.recv(buf, count, t, peer, tag);
  const RequestPtr r = irecv(buf, count, t, peer, tag);
  r->wait();
  keep_span(*r);
}

void NcclCommunicator::probe(int, int) {}

void NcclCommunicator::barrier() {
  last_on_device_ = false;
  begin();
  STRATA_CHECK_NCCL(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_));
  finish_blocking();
}

void NcclCommunicator::all_to_all(const void* send, void* recv, std::int64_t count_per_peer, DType t) {
  last_on_device_ = false;
  if (!on_device("all_to_all", send, recv)) return mpi_.all_to_all(send, recv, count_per_peer, t);
  const std::size_t n = to_count(count_per_peer, "all_to_all", "count_per_peer");
  const std::size_t block = n * dtype_size(t);
  const ncclDataType_t dt = nccl_datatype(t);
  begin();
  in_group([&](FirstFailure& f) {
    for (int p = 0; p < size(); ++p) {
      f("ncclSend", ncclSend(static_cast<const char*>(send) + p * block, n, dt, p, comm_, stream_));
      f("ncclRecv", ncclRecv(static_cast<char*>(recv) + p * block, n, dt, p, comm_, stream_));
    }
  });
  finish_blocking();
}

void NcclCommunicator::all_to_allv(const void* send, const std::int64_t* send_counts, const std::int64_t* send_displs,
                                   void* recv, const std::int64_t* recv_counts, const std::int64_t* recv_displs,
                                   DType t) {
  last_on_device_ = false;
  if (!on_device("all_to_allv", send, recv))
    return mpi_.all_to_allv(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
  // Checked before anything is posted, so a bad count leaves NCCL untouched.
  for (int p = 0; p < size(); ++p) {
    to_count(send_counts[p], "all_to_allv", "send count");
    to_count(send_displs[p], "all_to_allv", "send displacement");
    to_count(recv_counts[p], "all_to_allv", "recv count");
    to_count(recv_displs[p], "all_to_allv", "recv displacement");
  }
  const std::size_t es = dtype_size(t);
  const ncclDataType_t dt = nccl_datatype(t);
  begin();
  in_group([&](FirstFailure& f) {
    // Empty blocks are skipped on both ends alike: the counts agree.
    for (int p = 0; p < size(); ++p) {
      if (send_counts[p] > 0)
        f("ncclSend", ncclSend(static_cast<const char*>(send) + std::size_t(send_displs[p]) * es,
                               std::size_t(send_counts[p]), dt, p, comm_, stream_));
      if (recv_counts[p] > 0)
        f("ncclRecv", ncclRecv(static_cast<char*>(recv) + std::size_t(recv_displs[p]) * es,
                               std::size_t(recv_counts[p]), dt, p, comm_, stream_));
    }
  });
  finish_blocking();
}

// ---- non-blocking forms ----

RequestPtr NcclCommunicator::iall_reduce(void* buf, std::int64_t count, DType t, ReduceOp op) {
  if (!on_device("iall_reduce", buf)) return mpi_.iall_reduce(buf, count, t, op);
  const std::size_t n = to_count(count, "iall_reduce", "count");
  begin();
  STRATA_CHECK_NCCL(ncclAllReduce(buf, buf, n, nccl_datatype(t), nccl_op(op), comm_, stream_));
  return finish_nonblocking();
}

RequestPtr NcclCommunicator::ireduce_scatter(const void* send, void* recv, std::int64_t recv_count, DType t,
                                             ReduceOp op) {
  if (!on_device("ireduce_scatter", send, recv)) return mpi_.ireduce_scatter(send, recv, recv_count, t, op);
  const std::size_t n = to_count(recv_count, "ireduce_scatter", "recv_count");
  begin();
  STRATA_CHECK_NCCL(ncclReduceScatter(send, recv, n, nccl_datatype(t), nccl_op(op), comm_, stream_));
  return finish_nonblocking();
}

// In place (send is this rank's block of recv) is NCCL's in-place form too.
RequestPtr NcclCommunicator::iall_gather(const void* send, void* recv, std::int64_t send_count, DType t) {
  if (!on_device("iall_gather", send, recv)) return mpi_.iall_gather(send, recv, send_count, t);
  const std::size_t n = to_count(send_count, "iall_gather", "send_count");
  begin();
  STRATA_CHECK_NCCL(ncclAllGather(send, recv, n, nccl_datatype(t), comm_, stream_));
  return finish_nonblocking();
}

RequestPtr NcclCommunicator::ibroadcast(void* buf, std::int64_t count, DType t, int root) {
  if (!on_device("ibroadcast", buf)) return mpi_.ibroadcast(buf, count, t, root);
  const std::size_t n = to_count(count, "ibroadcast", "count");
  if (root < 0 || root >= size()) core::runtime_error("ibroadcast on '{}': root {} outside [0, {})", axis(), root, size());
  begin();
  STRATA_CHECK_NCCL(ncclBroadcast(buf, buf, n, nccl_datatype(t), root, comm_, stream_));
  return finish_nonblocking();
}

// Deferred (see the header); the tag is not sent: NCCL matches in order.
RequestPtr NcclCommunicator::isend(const void* buf, std::int64_t count, DType t, int peer, int tag) {
  if (!on_device("isend", buf)) return mpi_.isend(buf, count, t, peer, tag);
  if (peer < 0 || peer >= size()) core::runtime_error("isend on '{}': peer {} outside [0, {})", axis(), peer, size());
  return defer(P2p{true, const_cast<void*>(buf), to_count(count, "isend", "count"), nccl_datatype(t), peer});
}

RequestPtr NcclCommunicator::irecv(void* buf, std::int64_t count, DType t, int peer, int tag) {
  if (!on_device("irecv", buf)) return mpi_.irecv(buf, count, t, peer, tag);
  if (peer < 0 || peer >= size()) core::runtime_error("irecv on '{}': peer {} outside [0, {})", axis(), peer, size());
  return defer(P2p{false, buf, to_count(count, "irecv", "count"), nccl_datatype(t), peer});
}

}  // namespace strata::comm
