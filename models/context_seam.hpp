// The layer seam of context parallelism: where a block's attention meets the
// ranks holding the other parts of its sequences. Every other layer works
// on each token alone, so a model (models/decoder/decoder.cpp) runs on this rank's
// tokens only and asks the seam where they sit in the sequence and how
// attention is computed over the whole of it. The plain form is one rank
// holding whole sequences (the whole-sequence kernels); the parallel form,
// ring attention, is strategies/cp.cpp's, which the cp row's part of the
// composition step (strategies/parallelize.hpp) hands the model.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/foundation/ptr.hpp"

namespace strata::models {

class ContextSeam {
 public:
  virtual ~ContextSeam() = default;
  // Ranks each sequence is split over, and this one's place.
  virtual int size() const { return 1; }
  virtual int rank() const { return 0; }
  // This rank holds T / size() tokens of each sequence of T: its token t
  // (0 <= t < T / size()) is at position position(t, T) of the sequence.
  virtual int position(int t, int T) const { return t; }
  // How many of this rank's tokens from t on (t < T / size()) sit at
  // consecutive positions: the rows a position-wise kernel (RoPE, learned
  // positions) takes in one call. Walking token by token would cost the
  // meta device's estimate a virtual call per token, layer and pass.
  virtual int run_from(int t, int T) const { return T / size() - t; }
  // Attention's `state` (kept from the forward to the backward pass) for B
  // sequences of this rank's Tl tokens, NH query heads of C channels in all
  // and NKV key-value heads: its elements, and its format for activations of
  // format `act`. `scratch` (the backward's, which the forward may use too)
  // is a buffer of scratch_bytes() the seam carves its tensors from.
  virtual std::int64_t state_elements(bool fused, int B, int NH, int NKV, int Tl, int C) const;
  virtual core::Precision state_format(bool fused, core::Precision act) const;
  virtual std::int64_t scratch_bytes(bool fused, int B, int NH, int NKV, int Tl, int C, core::Precision act) const;
  // Causal attention over whole sequences for this rank's tokens, as
  // kernels::attention_forward and attention_backward state it: qkv
  // [B, Tl, C + 2 KVC] of this rank's tokens, out [B, Tl, C], dqkv +=
  // gradient.
  virtual void attention_forward(core::Ptr out, core::Ptr state, std::byte* scratch, core::CPtr qkv, int B, int Tl,
                                 int C, int NH, int NKV);
  virtual void attention_backward(core::Ptr dqkv, std::byte* scratch, core::CPtr dout, core::CPtr qkv, core::CPtr out,
                                  core::CPtr state, int B, int Tl, int C, int NH, int NKV);
};

// One rank holding whole sequences.
class WholeSequence : public ContextSeam {};
ContextSeam& whole_sequence();

}  // namespace strata::models
