#include "src/comm/meta_communicator.hpp"

#include "kernels/foundation/error.hpp"
#include "kernels/foundation/trace.hpp"

namespace strata::comm {

namespace {
// A non-blocking call's request: complete at once; waiting for it is
// recorded in the thread's trace (kernels/foundation/trace.hpp), where the
// simulator decides how long it took. A test finds it complete (the code's
// control flow, and so the memory it holds, is a run's that found it done)
// and records nothing: only a wait blocks the simulated rank.
struct Done : Request {
  explicit Done(int index) : index(index) {}
  void wait() override {
    if (!waited) prof::trace_wait(index);
    waited = true;
  }
  bool test() override { return true; }
  int index;
  bool waited = false;
};
std::int64_t bytes_of(std::int64_t count, DType t) { return count * std::int64_t(dtype_size(t)); }
}  // namespace

MetaCommunicator::MetaCommunicator(std::string axis, int size, int rank)
    : axis_(std::move(axis)), size_(size), rank_(rank) {
  STRATA_CHECK(size >= 1 && rank >= 0 && rank < size, "meta group {}: rank {} of {}", axis_, rank, size);
}

int MetaCommunicator::record(const char* op, std::int64_t bytes, bool nonblocking, int peer, int tag) const {
  return prof::trace_comm({op, axis_, size_, rank_, bytes, peer, tag, nonblocking});
}
RequestPtr MetaCommunicator::request(const char* op, std::int64_t bytes, int peer, int tag) const {
  return std::make_unique<Done>(record(op, bytes, true, peer, tag));
}

void MetaCommunicator::all_reduce(void*, std::int64_t count, DType t, ReduceOp) {
  record("all_reduce", bytes_of(count, t));
}
void MetaCommunicator::reduce_scatter(const void*, void*, std::int64_t recv_count, DType t, ReduceOp) {
  record("reduce_scatter", bytes_of(recv_count * size_, t));
}
void MetaCommunicator::all_gather(const void*, void*, std::int64_t send_count, DType t) {
  record("all_gather", bytes_of(send_count * size_, t));
}
void MetaCommunicator::broadcast(void*, std::int64_t count, DType t, int) { record("broadcast", bytes_of(count, t)); }
void MetaCommunicator::all_to_all(const void*, void*, std::int64_t count_per_peer, DType t) {
  record("all_to_all", bytes_of(count_per_peer * size_, t));
}
void MetaCommunicator::all_to_allv(const void*, const std::int64_t* send_counts, const std::int64_t*, void*,
                                   const std::int64_t*, const std::int64_t*, DType t) {
  std::int64_t sent = 0;
  for (int p = 0; p < size_; ++p) sent += send_counts[p];
  record("all_to_allv", bytes_of(sent, t));
}
void MetaCommunicator::send(const void*, std::int64_t count, DType t, int peer, int tag) {
  record("send", bytes_of(count, t), false, peer, tag);
}
void MetaCommunicator::recv(void*, std::int64_t count, DType t, int peer, int tag) {
  record("recv", bytes_of(count, t), false, peer, tag);
}
void MetaCommunicator::probe(int, int) {}
void MetaCommunicator::barrier() { record("barrier", 0); }
RequestPtr MetaCommunicator::iall_reduce(void*, std::int64_t count, DType t, ReduceOp) {
  return request("all_reduce", bytes_of(count, t));
}
RequestPtr MetaCommunicator::ireduce_scatter(const void*, void*, std::int64_t recv_count, DType t, ReduceOp) {
  return request("reduce_scatter", bytes_of(recv_count * size_, t));
}
RequestPtr MetaCommunicator::iall_gather(const void*, void*, std::int64_t send_count, DType t) {
  return request("all_gather", bytes_of(send_count * size_, t));
}
RequestPtr MetaCommunicator::ibroadcast(void*, std::int64_t count, DType t, int) {
  return request("broadcast", bytes_of(count, t));
}
RequestPtr MetaCommunicator::isend(const void*, std::int64_t count, DType t, int peer, int tag) {
  return request("send", bytes_of(count, t), peer, tag);
}
RequestPtr MetaCommunicator::irecv(void*, std::int64_t count, DType t, int peer, int tag) {
  return request("recv", bytes_of(count, t), peer, tag);
}

}  // namespace strata::comm
