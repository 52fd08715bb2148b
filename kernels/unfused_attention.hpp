// Causal self-attention as Megatron-LM ran it before FlashAttention
// (model.attention = "unfused"), composed of kernels every backend has: per
// sequence and query head, S = q k^T / sqrt(hs) by a batched product over
// the whole T x T square (a batch holds one query head per key-value head;
// the query heads sharing one run one batch after another), then the causal softmax
// in place (causal_softmax_forward), then out = P v by a second batched
// product. The probabilities P [B, NH, T, T] stay, in the activations'
// format, for the backward pass, which runs the products transposed around
// causal_softmax_backward. The contract (shapes, heads, grouped-query
// layout, dqkv accumulated) is kernels::attention_forward's and
// attention_backward's for the CPU backend's state: the probabilities, with
// a scratch of as many elements for their gradient
// (attention_state_elements(false, ...)). On the meta device the dry run
// counts exactly these kernels: the scores written, read and rewritten in
// memory, the products over the full square.
#pragma once

#include "kernels/foundation/ptr.hpp"

namespace strata::kernels {

void unfused_attention_forward(core::Ptr out, core::Ptr probs, core::CPtr qkv, int B, int T, int C, int NH, int NKV);
void unfused_attention_backward(core::Ptr dqkv, core::Ptr dprobs, core::CPtr dout, core::CPtr qkv, core::CPtr probs,
                                int B, int T, int C, int NH, int NKV);

}  // namespace strata::kernels
