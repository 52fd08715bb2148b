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
// computes), and after cp steps reach the block's owner. The blocks and
// their gradients travel in the activations' format; a step's gradient of a
// block is summed in fp32 on each rank and rounded once, as it leaves.
class RingAttention final : public models::ContextSeam {
 public:
  explicit RingAttention(comm::Communicator& cp) : cp_(cp) {}

  int size() const override { return cp_.size(); }
  int rank() const override { return cp_.rank(); }
  int position(int t, int T) const override;
  int run_from(int t, int T) const override;
  // The rows' log-sum-exp [B, NH, Tl], fp32; scratch, key-value blocks
  // [B, Tl, 2 KVC]: two in the activations' format forward; backward also
  // this rank's gradient of a block, two in fp32 (one leaving while the
  // other fills) and two of their rounding as sent, and the gradient
  // arriving.
  std::int64_t state_elements(bool fused, int B, int NH, int NKV, int Tl, int C) const override;
  core::Precision state_format(bool fused, core::Precision act) const override;
  std::int64_t scratch_bytes(bool fused, int B, int NH, int NKV, int Tl, int C, core::Precision act) const override;
  void attention_forward(core::Ptr out, core::Ptr state, std::byte* scratch, core::CPtr qkv, int B, int Tl, int C,
                         int NH, int NKV) override;
  void attention_backward(core::Ptr dqkv, std::byte* scratch, core::CPtr dout, core::CPtr qkv, core::CPtr out,
                          core::CPtr state, int B, int Tl, int C, int NH, int NKV) override;

 private:
  comm::Communicator& cp_;
};

// The seam of the layer row cp: over `cp` (whole sequences when null or of
// one rank).
std::unique_ptr<models::ContextSeam> make_context_seam(comm::Communicator* cp);

// The layer seam's row of cp.
const Row& context_parallel_row();

}  // namespace strata::strategies
