// MpiCommunicator: the interface's calls on MPI-3. MPI counts are int, so any
// count or displacement outside [0, INT_MAX] is refused with a runtime error
// rather than truncated; a caller that needs more splits the transfer.
#include "src/comm/mpi_communicator.hpp"

#include <climits>
#include <cstdio>

#include "src/comm/mpi_check.hpp"
#include "kernels/foundation/error.hpp"
#include "kernels/foundation/precision.hpp"

namespace strata::comm {

namespace {

int to_int(std::int64_t n, const char* call, const char* what) {
  if (n < 0 || n > std::int64_t(INT_MAX))
    core::runtime_error("{}: {} {} is outside MPI's int range [0, {}]; split the transfer", call, what, n,
                        INT_MAX);
  return int(n);
}

// A request on MPI_Request. MPI sets the handle to MPI_REQUEST_NULL once the
// operation completes, so the handle itself says whether it is finished.
class MpiRequest : public Request {
 public:
  // For receives, `expect` elements of `dt` must arrive: MPI accepts a shorter
  // message silently, which would leave stale data in the buffer.
  explicit MpiRequest(MPI_Request r, MPI_Datatype dt = MPI_DATATYPE_NULL, int expect = -1)
      : req_(r), dt_(dt), expect_(expect) {}
  MpiRequest(const MpiRequest&) = delete;
  MpiRequest& operator=(const MpiRequest&) = delete;

  ~MpiRequest() override {
    if (req_ == MPI_REQUEST_NULL) return;
    // After MPI_Finalize nothing can be waited on; the operation is lost either way.
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    finish_in_destructor(*this, "MPI request");
  }

  void wait() override {
    if (req_ == MPI_REQUEST_NULL) return;
    MPI_Status st;
    STRATA_CHECK_MPI(MPI_Wait(&req_, &st));
    check_count(st);
  }

  bool test() override {
    if (req_ == MPI_REQUEST_NULL) return true;
    int flag = 0;
    MPI_Status st;
    STRATA_CHECK_MPI(MPI_Test(&req_, &flag, &st));
    if (flag) check_count(st);
    return flag != 0;
  }

 private:
  void check_count(const MPI_Status& st) const {
    if (expect_ < 0) return;
    int got = 0;
    STRATA_CHECK_MPI(MPI_Get_count(&st, dt_, &got));
    if (got != expect_)
      core::runtime_error("irecv: expected {} element(s) from rank {}, got {}", expect_, st.MPI_SOURCE, got);
  }

  MPI_Request req_;
  MPI_Datatype dt_;
  int expect_;
};

}  // namespace

namespace {

// The 16-bit formats: a committed datatype each (two bytes, so MPI moves them
// as it would any 16-bit integer) and one user-defined sum that tells them
// apart by datatype. Created on first use, after MPI_Init, and freed at the
// start of MPI_Finalize (which deletes MPI_COMM_SELF's attributes first).
struct HalfTypes {
  MPI_Datatype bf16 = MPI_DATATYPE_NULL, f16 = MPI_DATATYPE_NULL;
  MPI_Op sum = MPI_OP_NULL;
};

void half_sum(void* in, void* inout, int* len, MPI_Datatype* dt);

int free_half_types(MPI_Comm, int, void* attr, void*) {
  auto* h = static_cast<HalfTypes*>(attr);
  MPI_Type_free(&h->bf16);
  MPI_Type_free(&h->f16);
  MPI_Op_free(&h->sum);
  return MPI_SUCCESS;
}

const HalfTypes& half_types() {
  static const HalfTypes types = [] {
    HalfTypes h;
    STRATA_CHECK_MPI(MPI_Type_contiguous(1, MPI_UINT16_T, &h.bf16));
    STRATA_CHECK_MPI(MPI_Type_commit(&h.bf16));
    STRATA_CHECK_MPI(MPI_Type_contiguous(1, MPI_UINT16_T, &h.f16));
    STRATA_CHECK_MPI(MPI_Type_commit(&h.f16));
    STRATA_CHECK_MPI(MPI_Op_create(&half_sum, /*commute=*/1, &h.sum));
    return h;
  }();
  static const bool freed_at_finalize = [] {
    int key = MPI_KEYVAL_INVALID;
    STRATA_CHECK_MPI(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_half_types, &key, nullptr));
    STRATA_CHECK_MPI(MPI_Comm_set_attr(MPI_COMM_SELF, key, const_cast<HalfTypes*>(&types)));
    return true;
  }();
  (void)freed_at_finalize;
  return types;
}

void half_sum(void* in, void* inout, int* len, MPI_Datatype* dt) {
  const core::Precision p = *dt == half_types().bf16 ? core::Precision::bf16 : core::Precision::fp16;
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = core::float_to_half(core::half_to_float(a[i], p) + core::half_to_float(b[i], p), p);
}

}  // namespace

MPI_Datatype mpi_datatype(DType t) {
  switch (t) {
    case DType::bf16: return half_types().bf16;
    case DType::f16: return half_types().f16;
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
  }
  STRATA_CHECK(false, "unknown DType {}", int(t));
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op, DType t) {
  if (t == DType::bf16 || t == DType::f16) {
    STRATA_CHECK(op == ReduceOp::sum, "16-bit reductions are sums only");
    return half_types().sum;
  }
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  STRATA_CHECK(false, "unknown ReduceOp {}", int(op));
  return MPI_OP_NULL;
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string axis) : comm_(comm), axis_(std::move(axis)) {
  STRATA_CHECK(comm != MPI_COMM_NULL, "MpiCommunicator '{}' on MPI_COMM_NULL", axis_);
  STRATA_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  STRATA_CHECK_MPI(MPI_Comm_size(comm_, &size_));
}

bool MpiCommunicator::gather_in_place(const void* send, const void* recv, std::int64_t send_count, DType t) const {
  return static_cast<const char*>(send) ==
         static_cast<const char*>(recv) + std::int64_t(rank_) * send_count * std::int64_t(dtype_size(t));
}

void MpiCommunicator::all_reduce(void* buf, std::int64_t count, DType t, ReduceOp op) {
  const int n = to_int(count, "all_reduce", "count");
  STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, buf, n, mpi_datatype(t), mpi_op(op, t), comm_));
}

void MpiCommunicator::reduce_scatter(const void* send, void* recv, std::int64_t recv_count, DType t, ReduceOp op) {
  const int n = to_int(recv_count, "reduce_scatter", "recv_count");
  STRATA_CHECK_MPI(MPI_Reduce_scatter_block(send, recv, n, mpi_datatype(t), mpi_op(op, t), comm_));
}

void MpiCommunicator::all_gather(const void* send, void* recv, std::int64_t send_count, DType t) {
  const int n = to_int(send_count, "all_gather", "send_count");
  const MPI_Datatype dt = mpi_datatype(t);
  if (gather_in_place(send, recv, send_count, t))
    STRATA_CHECK_MPI(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n, dt, comm_));
  else
    STRATA_CHECK_MPI(MPI_Allgather(send, n, dt, recv, n, dt, comm_));
}

void MpiCommunicator::broadcast(void* buf, std::int64_t count, DType t, int root) {
  const int n = to_int(count, "broadcast", "count");
  STRATA_CHECK_MPI(MPI_Bcast(buf, n, mpi_datatype(t), root, comm_));
}

void MpiCommunicator::all_to_all(const void* send, void* recv, std::int64_t count_per_peer, DType t) {
  const int n = to_int(count_per_peer, "all_to_all", "count_per_peer");
  const MPI_Datatype dt = mpi_datatype(t);
  STRATA_CHECK_MPI(MPI_Alltoall(send, n, dt, recv, n, dt, comm_));
}

void MpiCommunicator::all_to_allv(const void* send, const std::int64_t* send_counts, const std::int64_t* send_displs,
                                  void* recv, const std::int64_t* recv_counts, const std::int64_t* recv_displs,
                                  DType t) {
  sc_.resize(size_);
  sd_.resize(size_);
  rc_.resize(size_);
  rd_.resize(size_);
  for (int p = 0; p < size_; ++p) {
    sc_[p] = to_int(send_counts[p], "all_to_allv", "send count");
    sd_[p] = to_int(send_displs[p], "all_to_allv", "send displacement");
    rc_[p] = to_int(recv_counts[p], "all_to_allv", "recv count");
    rd_[p] = to_int(recv_displs[p], "all_to_allv", "recv displacement");
  }
  const MPI_Datatype dt = mpi_datatype(t);
  STRATA_CHECK_MPI(MPI_Alltoallv(send, sc_.data(), sd_.data(), dt, recv, rc_.data(), rd_.data(), dt, comm_));
}

void MpiCommunicator::send(const void* buf, std::int64_t count, DType t, int peer, int tag) {
  const int n = to_int(count, "send", "count");
  STRATA_CHECK_MPI(MPI_Send(buf, n, mpi_datatype(t), peer, tag, comm_));
}

void MpiCommunicator::probe(int peer, int tag) {
  MPI_Status st;
  STRATA_CHECK_MPI(MPI_Probe(peer, tag, comm_, &st));
}

void MpiCommunicator::recv(void* buf, std::int64_t count, DType t, int peer, int tag) {
  const int n = to_int(count, "recv", "count");
  const MPI_Datatype dt = mpi_datatype(t);
  MPI_Status st;
  STRATA_CHECK_MPI(MPI_Recv(buf, n, dt, peer, tag, comm_, &st));
  // A longer message is MPI_ERR_TRUNCATE; a shorter one MPI accepts silently.
  int got = 0;
  STRATA_CHECK_MPI(MPI_Get_count(&st, dt, &got));
  if (got != n) core::runtime_error("recv on '{}': expected {} element(s) from rank {}, got {}", axis_, n, peer, got);
}

void MpiCommunicator::barrier() { STRATA_CHECK_MPI(MPI_Barrier(comm_)); }

RequestPtr MpiCommunicator::iall_reduce(void* buf, std::int64_t count, DType t, ReduceOp op) {
  const int n = to_int(count, "iall_reduce", "count");
  MPI_Request r;
  STRATA_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, buf, n, mpi_datatype(t), mpi_op(op, t), comm_, &r));
  return std::make_unique<MpiRequest>(r);
}

RequestPtr MpiCommunicator::ireduce_scatter(const void* send, void* recv, std::int64_t recv_count, DType t,
                                            ReduceOp op) {
  const int n = to_int(recv_count, "ireduce_scatter", "recv_count");
  MPI_Request r;
  STRATA_CHECK_MPI(MPI_Ireduce_scatter_block(send, recv, n, mpi_datatype(t), mpi_op(op, t), comm_, &r));
  return std::make_unique<MpiRequest>(r);
}

RequestPtr MpiCommunicator::iall_gather(const void* send, void* recv, std::int64_t send_count, DType t) {
  const int n = to_int(send_count, "iall_gather", "send_count");
  const MPI_Datatype dt = mpi_datatype(t);
  MPI_Request r;
  if (gather_in_place(send, recv, send_count, t))
    STRATA_CHECK_MPI(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n, dt, comm_, &r));
  else
    STRATA_CHECK_MPI(MPI_Iallgather(send, n, dt, recv, n, dt, comm_, &r));
  return std::make_unique<MpiRequest>(r);
}

RequestPtr MpiCommunicator::ibroadcast(void* buf, std::int64_t count, DType t, int root) {
  const int n = to_int(count, "ibroadcast", "count");
  MPI_Request r;
  STRATA_CHECK_MPI(MPI_Ibcast(buf, n, mpi_datatype(t), root, comm_, &r));
  return std::make_unique<MpiRequest>(r);
}

RequestPtr MpiCommunicator::isend(const void* buf, std::int64_t count, DType t, int peer, int tag) {
  const int n = to_int(count, "isend", "count");
  MPI_Request r;
  STRATA_CHECK_MPI(MPI_Isend(buf, n, mpi_datatype(t), peer, tag, comm_, &r));
  return std::make_unique<MpiRequest>(r);
}

RequestPtr MpiCommunicator::irecv(void* buf, std::int64_t count, DType t, int peer, int tag) {
  const int n = to_int(count, "irecv", "count");
  const MPI_Datatype dt = mpi_datatype(t);
  MPI_Request r;
  STRATA_CHECK_MPI(MPI_Irecv(buf, n, dt, peer, tag, comm_, &r));
  return std::make_unique<MpiRequest>(r, dt, n);
}

}  // namespace strata::comm
