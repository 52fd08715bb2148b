// Context parallelism on the layer seam (models/context_seam.hpp): each
// sequence split over the cp group, attention computed over the whole of it
// by passing keys and values around the group's ring (ring attention: Liu et
// al., 2023; Megatron-LM's context parallelism). A sequence is cut into
// 2 cp chunks and rank r holds chunks r and 2 cp - 1 - r, so that every rank
// does the same causal work (as Megatron-LM and Llama 3 balance it).
#pragma once

#include <memory>

#include "kernels/foundation/communicator.hpp"
#include "models/context_seam.hpp"
#include "models/wire.hpp"
#include "strategies/registry.hpp"

namespace strata::strategies {

// Forward, at ring step s = 0 .. cp - 1 rank r holds the keys and values of
// rank r - s (its own at s = 0), sends them on to r + 1 and receives the next
// from r - 1 while it computes its queries' blocks against them
// (kernels::attention_block_forward, merged into the running output and
// log-sum-exp). Of the four chunk pairs a step meets, the causal ones run:
// three at s = 0 (two diagonal), two at every other step. Backward, the same
// ring: each step's key and value gradients, added to what the ranks before
// computed for the same block, travel on with it (while the next step
// computes), and after cp steps reach the block's owner.
class RingAttention final : public models::ContextSeam {
 public:
  RingAttention(comm::Communicator& cp, const models::Wire& wire) : cp_(cp), wire_(wire) {}

  int size() const override { return cp_.size(); }
  int rank() const override { return cp_.rank(); }
  int position(int t, int T) const override;
  // The rows' log-sum-exp [B, NH, Tl]; scratch: two key-value blocks
  // [B, Tl, 2 KVC] forward, five backward (the block in use, the next one, two
  // of this rank's gradient of a block, one leaving while the other fills,
  // and the gradient arriving).
  std::int64_t state_floats(bool fused, int B, int NH, int NKV, int Tl, int C) const override;
  std::int64_t scratch_floats(bool fused, int B, int NH, int NKV, int Tl, int C) const override;
  void attention_forward(float* out, float* state, float* scratch, const float* qkv, int B, int Tl, int C, int NH,
                         int NKV) override;
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* out,
                          const float* state, int B, int Tl, int C, int NH, int NKV) override;

 private:
  comm::Communicator& cp_;
  models::Wire wire_;  // the blocks and their gradients travel in the compute precision
};

// The seam of the layer row cp: over `cp` (whole sequences when null or of
// one rank), its blocks on `wire`.
std::unique_ptr<models::ContextSeam> make_context_seam(comm::Communicator* cp, const models::Wire& wire);

// The layer seam's row of cp.
const Row& context_parallel_row();

}  // namespace strata::strategies
