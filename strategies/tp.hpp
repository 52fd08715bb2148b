// Tensor parallelism (Megatron-LM) and sequence parallelism (Korthikanti et
// al., 2022) on the layer seam (models/tensor_seam.hpp): the attention heads,
// the MLP's hidden units and the vocabulary are split over the tp group, and
// the operators f and g at the linears' edges become collectives on its
// communicator, so every one is profiled on the `tp` axis. With sequence
// parallelism the residual stream and the norms hold 1/tp of the rows
// (contiguous rows of the flattened batch x sequence: for norms and
// residual adds any partition of tokens is the same computation, and
// contiguous rows keep the all-gather in order); f is then an all-gather
// forward and a reduce-scatter backward, g the reverse, and the gradients of
// the replicated norm and bias parameters, computed from each rank's rows,
// are summed over the group.
#pragma once

#include <memory>

#include "kernels/foundation/communicator.hpp"
#include "models/tensor_seam.hpp"

namespace strata::strategies {

class TensorParallelSeam final : public models::TensorSeam {
 public:
  TensorParallelSeam(comm::Communicator& tp, bool sequence_parallel) : tp_(tp), sp_(sequence_parallel) {}

  int size() const override { return tp_.size(); }
  int rank() const override { return tp_.rank(); }
  std::int64_t rows(std::int64_t N) const override;
  std::int64_t first_row(std::int64_t N) const override { return sp_ ? std::int64_t(tp_.rank()) * rows(N) : 0; }
  core::CPtr gather(core::CPtr mine, core::Ptr all, std::int64_t N, int C) override;
  core::CPtr reduce(core::Ptr partial, core::Ptr mine, std::int64_t N, int C) override;
  void all_reduce(float* x, std::int64_t n, comm::ReduceOp op) override;
  void reduce_replicated(float* grads, std::int64_t n) override;

 private:
  // gather and reduce move activations and their gradients in their
  // format (the compute precision); all_reduce (the cross-entropy's
  // statistics) and reduce_replicated (parameter gradients) stay fp32.
  comm::Communicator& tp_;
  bool sp_;
};

// The seam of the layer row tp: over `tp` (one rank, the plain seam, when
// null or of one rank).
std::unique_ptr<models::TensorSeam> make_tensor_seam(comm::Communicator* tp, bool sequence_parallel);

}  // namespace strata::strategies
