#include "strategies/tp.hpp"

#include "kernels/foundation/error.hpp"

namespace strata::strategies {

std::int64_t TensorParallelSeam::rows(std::int64_t N) const {
  if (!sp_) return N;
  STRATA_CHECK(N % tp_.size() == 0, "{} rows over tp {}", N, tp_.size());
  return N / tp_.size();
}

const float* TensorParallelSeam::gather(const float* mine, float* all, std::int64_t N, int C) {
  if (!sp_) return mine;  // every rank holds every row
  tp_.all_gather(mine, all, rows(N) * C, comm::DType::f32);
  return all;
}

const float* TensorParallelSeam::reduce(float* partial, float* mine, std::int64_t N, int C) {
  if (!sp_) {
    tp_.all_reduce(partial, N * C, comm::DType::f32, comm::ReduceOp::sum);
    return partial;
  }
  tp_.reduce_scatter(partial, mine, rows(N) * C, comm::DType::f32, comm::ReduceOp::sum);
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
