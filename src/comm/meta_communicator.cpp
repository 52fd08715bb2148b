#include "src/comm/meta_communicator.hpp"

#include "kernels/foundation/error.hpp"

namespace strata::comm {

namespace {
struct Done : Request {
  void wait() override {}
  bool test() override { return true; }
};
RequestPtr done() { return std::make_unique<Done>(); }
}  // namespace

MetaCommunicator::MetaCommunicator(std::string axis, int size, int rank)
    : axis_(std::move(axis)), size_(size), rank_(rank) {
  STRATA_CHECK(size >= 1 && rank >= 0 && rank < size, "meta group {}: rank {} of {}", axis_, rank, size);
}

void MetaCommunicator::all_reduce(void*, std::int64_t, DType, ReduceOp) {}
void MetaCommunicator::reduce_scatter(const void*, void*, std::int64_t, DType, ReduceOp) {}
void MetaCommunicator::all_gather(const void*, void*, std::int64_t, DType) {}
void MetaCommunicator::broadcast(void*, std::int64_t, DType, int) {}
void MetaCommunicator::all_to_all(const void*, void*, std::int64_t, DType) {}
void MetaCommunicator::all_to_allv(const void*, const std::int64_t*, const std::int64_t*, void*, const std::int64_t*,
                                   const std::int64_t*, DType) {}
void MetaCommunicator::send(const void*, std::int64_t, DType, int, int) {}
void MetaCommunicator::recv(void*, std::int64_t, DType, int, int) {}
void MetaCommunicator::probe(int, int) {}
void MetaCommunicator::barrier() {}
RequestPtr MetaCommunicator::iall_reduce(void*, std::int64_t, DType, ReduceOp) { return done(); }
RequestPtr MetaCommunicator::ireduce_scatter(const void*, void*, std::int64_t, DType, ReduceOp) { return done(); }
RequestPtr MetaCommunicator::iall_gather(const void*, void*, std::int64_t, DType) { return done(); }
RequestPtr MetaCommunicator::ibroadcast(void*, std::int64_t, DType, int) { return done(); }
RequestPtr MetaCommunicator::isend(const void*, std::int64_t, DType, int, int) { return done(); }
RequestPtr MetaCommunicator::irecv(void*, std::int64_t, DType, int, int) { return done(); }

}  // namespace strata::comm
