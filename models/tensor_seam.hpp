// The layer seam of tensor (and sequence) parallelism: the points where the
// layers of a GPT block meet the other ranks that share them, as Megatron-LM
// places them. The models (models/decoder/decoder.cpp) are written once against this
// interface; models::OneRank is its plain form (one rank: nothing to
// exchange), and the parallel form is strategies/tp.cpp's, which the tp
// row's part of the composition step (strategies/parallelize.hpp) builds.
//
//   f, at a column-parallel linear's input:  forward identity,  backward sum
//   g, at a row-parallel linear's output:    forward sum,       backward identity
// With sequence parallelism the residual stream and the norms hold this
// rank's rows only: f gathers the rows forward and reduce-scatters their
// gradients backward; g reduce-scatters forward and gathers backward. So two
// operations serve both: gather (f forward, g backward) and reduce (g
// forward, f backward). Activations and their gradients cross ranks in
// their format (the compute precision); a sum over ranks adds in fp32 and
// rounds once per pairwise combination (the communicator's 16-bit sum).
#pragma once

#include <cstdint>

#include "kernels/foundation/communicator.hpp"
#include "kernels/foundation/ptr.hpp"

namespace strata::models {

class TensorSeam {
 public:
  virtual ~TensorSeam() = default;
  // Ranks splitting the heads, the MLP's hidden units and the vocabulary.
  virtual int size() const { return 1; }
  virtual int rank() const { return 0; }
  // Of a micro-batch's N rows (tokens), those this rank's residual stream
  // holds: [first_row, first_row + rows) (all N unless sequence parallel).
  virtual std::int64_t rows(std::int64_t N) const { return N; }
  virtual std::int64_t first_row(std::int64_t N) const { return 0; }
  // All N rows [N, C] from every rank's rows, this rank's at `mine`: either
  // `mine` itself (it holds all), or `all`, gathered into (mine may be
  // all + first_row * C: in place).
  virtual core::CPtr gather(core::CPtr mine, core::Ptr all, std::int64_t N, int C) { return mine; }
  // This rank's rows of the sum over ranks of `partial` [N, C] (which may be
  // overwritten): `partial` itself (summed in place), or `mine`, reduced into.
  virtual core::CPtr reduce(core::Ptr partial, core::Ptr mine, std::int64_t N, int C) { return partial; }
  // A reduction over ranks in place (the vocabulary-parallel
  // cross-entropy's row maximum, sum of exponentials and target logit).
  virtual void all_reduce(float* x, std::int64_t n, comm::ReduceOp op) {}
  // The gradients of parameters every rank holds whole (norms, row-parallel
  // biases), computed from this rank's rows: summed over ranks where the
  // rows are split.
  virtual void reduce_replicated(float* grads, std::int64_t n) {}
};

// One rank: every operation returns its input.
class OneRank : public TensorSeam {};
TensorSeam& one_rank();

}  // namespace strata::models
