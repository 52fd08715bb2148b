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
  wire_.all_gather(tp_, mine, all, rows(N) * C);
  return all;
}

const float* TensorParallelSeam::reduce(float* partial, float* mine, std::int64_t N, int C) {
  if (!sp_) {
    wire_.all_reduce(tp_, partial, N * C);
    return partial;
  }
  wire_.reduce_scatter(tp_, partial, mine, rows(N) * C);
  return mine;
}

void TensorParallelSeam::all_reduce(float* x, std::int64_t n, comm::ReduceOp op) {
  tp_.all_reduce(x, n, comm::DType::f32, op);
}

void TensorParallelSeam::reduce_replicated(float* grads, std::int64_t n) {
  // Without sequence parallelism every rank computed them from every row.
  if (sp_) tp_.all_reduce(grads, n, comm::DType::f32, comm::ReduceOp::sum);
}

std::unique_ptr<models::TensorSeam> make_tensor_seam(comm::Communicator* tp, bool sequence_parallel,
                                                     const models::Wire& wire) {
  if (tp == nullptr || tp->size() == 1) return std::make_unique<models::OneRank>();
  return std::make_unique<TensorParallelSeam>(*tp, sequence_parallel, wire);
}

}  // namespace strata::strategies
