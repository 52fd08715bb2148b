#include "strategies/tp.hpp"

#include "kernels/foundation/error.hpp"

namespace strata::strategies {

std::int64_t TensorParallelSeam::rows(std::int64_t N) const {
  if (!sp_) return N;
  STRATA_CHECK(N % tp_.size() == 0, "{} rows over tp {}", N, tp_.size());
  return N / tp_.size();
}

core::CPtr TensorParallelSeam::gather(core::CPtr mine, core::Ptr all, std::int64_t N, int C) {
  if (!sp_) return mine;  // every rank holds every row
  tp_.all_gather(mine.get(), all.get(), rows(N) * C, comm::dtype_of(mine.precision()));
  return all;
}

core::CPtr TensorParallelSeam::reduce(core::Ptr partial, core::Ptr mine, std::int64_t N, int C) {
  const comm::DType t = comm::dtype_of(partial.precision());
  if (!sp_) {
    tp_.all_reduce(partial.get(), N * C, t, comm::ReduceOp::sum);
    return partial;
  }
  tp_.reduce_scatter(partial.get(), mine.get(), rows(N) * C, t, comm::ReduceOp::sum);
  return mine;
}

void TensorParallelSeam::all_reduce(float* x, std::int64_t n, comm::ReduceOp op) {
  tp_.all_reduce(x, n, comm::DType::f32, op);
}

void TensorParallelSeam::reduce_replicated(float* grads, std::int64_t n) {
  // Without sequence parallelism every rank computed them from every row.
  if (sp_) tp_.all_reduce(grads, n, comm::DType::f32, comm::ReduceOp::sum);
}

std::unique_ptr<models::TensorSeam> make_tensor_seam(comm::Communicator* tp, bool sequence_parallel) {
  if (tp == nullptr || tp->size() == 1) return std::make_unique<models::OneRank>();
  return std::make_unique<TensorParallelSeam>(*tp, sequence_parallel);
}

}  // namespace strata::strategies
