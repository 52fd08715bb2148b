// A Mixture-of-Experts MLP (Switch Transformer / GShard): a linear router
// with softmax, top-k gating, a capacity per expert with token dropping (or
// none), experts that are the dense model's MLP, and the load-balancing
// auxiliary loss. One forward and one backward over a group of tokens (the
// rows of one micro-batch), llm.c style: every buffer is named below.
//
// Routing is a pure function of the group: the top-k experts of each token
// (ties to the lower index), then slots filled choice by choice (every
// token's first choice, in token order, then every token's second), each
// expert taking at most `capacity` tokens; an assignment past it is dropped
// (the token's residual stream carries it on). So the same group routes the
// same way on any layout.
//
// Expert parallelism (GShard): the experts are split over the ep ranks, rank
// r holding experts [r E/ep, (r+1) E/ep). Each rank routes its own group;
// the kept tokens' rows go to their experts' ranks by all-to-all(v) (the
// counts per expert exchanged first), each expert runs its MLP over the rows
// of every rank at once, and the outputs come back the same way; the
// backward pass sends output gradients out and input gradients back. With
// one ep rank the exchanges are copies and the layer is the plain one.
#pragma once

#include <cstdint>
#include <vector>

#include "models/buffers.hpp"
#include "models/expert_seam.hpp"
#include "models/linear.hpp"
#include "kernels/foundation/communicator.hpp"
#include "kernels/foundation/memory.hpp"
#include "kernels/foundation/ptr.hpp"

namespace strata::models {


struct MoeConfig {
  int d_model = 64;
  int ffn = 256;               // hidden units of each expert
  int experts = 4;
  int top_k = 2;               // 1 or 2
  double capacity_factor = 1.25;
  bool drop_tokens = true;     // false: every expert takes every token sent to it
  bool renormalize = true;     // gates = top-k probabilities / their sum (else the probabilities)
  float aux_coef = 0.01f;      // weight of the load-balancing loss in the training loss
  Activation act = Activation::gelu;  // the experts' MLP: GELU, or SwiGLU (Mixtral's)
  bool bias = true;                   // the experts' linears have biases
  // The format of its activations and their gradients (the run's).
  core::Precision precision = core::Precision::fp32;
  // Outputs of an expert's first linear.
  int fc_out() const { return activation_inputs(act, ffn); }
};

// Tokens an expert takes from a group of `tokens`: ceil(capacity_factor x
// tokens x top_k / experts), or all of them without dropping.
int moe_capacity(const MoeConfig& c, int tokens);

// The buffers of a MoE layer over a group of `tokens`: router
// probabilities, the rows sent and received, the local experts' inputs,
// hidden activations and outputs, and the backward scratch, in the layer's
// format; the scratch (shared) is the rank's, one for every MoE layer. Each holds E x capacity rows on every ep layout: a rank's E/ep
// experts take up to capacity rows from each of the ep ranks.
std::vector<BufferSpec> moe_buffers(const MoeConfig& c, int tokens);

// Parameter views: the router [E, C] and this rank's experts' weights laid
// out expert after expert ([E/ep, F', C], [E/ep, F'], [E/ep, C, F], [E/ep, C];
// F' = fc_out(), the biases null without them), as torch's nn.Linear stores
// each, in the layer's format; their gradients fp32.
struct MoeParams {
  core::CPtr router, fc_w, fc_b, proj_w, proj_b;
};
struct MoeGrads {
  float *router, *fc_w, *fc_b, *proj_w, *proj_b;
};

class MoeLayer {
 public:
  // `ep` (which must outlive the layer): where its tokens meet the ranks
  // holding the other experts (models/expert_seam.hpp).
  // `scratch`: the rank's shared scratch (models/buffers.hpp); null: its own.
  MoeLayer(const MoeConfig& c, int tokens, core::MemoryTracker& tracker, ExpertSeam& ep = one_expert_rank(),
           Scratch* scratch = nullptr);
  // Its buffers, as moe_buffers lists them.
  const std::vector<BufferSpec>& buffers() const { return bufs_.specs(); }

  // y[N, C] = MoE(x[N, C]). Returns the auxiliary loss, aux_coef x E x
  // sum_e f_e P_e (f_e: share of the group's tokens whose first choice is e;
  // P_e: mean router probability of e), to be added to the training loss.
  float forward(core::Ptr y, core::CPtr x, const MoeParams& p);
  // For the last forward: dx += d(loss)/dx and gradients += d(loss)/dparams,
  // where loss = sum(y * dy) + aux_scale x the auxiliary loss.
  void backward(core::Ptr dx, core::CPtr dy, core::CPtr x, const MoeParams& p, const MoeGrads& g, float aux_scale);

  // Routing of the last forward (this rank's group, every expert).
  const MoeConfig& config() const { return c_; }
  const ExpertSeam& ep() const { return *ep_; }
  int capacity() const { return cap_; }
  const std::vector<int>& routed() const { return routed_; }    // assignments per expert, before dropping
  const std::vector<int>& kept() const { return count_; }       // assignments per expert that fit
  int dropped() const { return dropped_; }                      // assignments past capacity
  float aux() const { return aux_; }                            // the auxiliary loss
  const std::vector<double>& prob_mass() const { return mass_; }  // sum of router probabilities per expert
  const std::vector<int>& choices() const { return topk_; }     // [N, k] expert of each choice
  const std::vector<int>& slots() const { return slot_; }       // [N, k] slot in its expert, -1 if dropped
  // Rows this rank's local experts took in the last forward, from each ep
  // rank: [ep, E/ep].
  const std::vector<int>& received() const { return recv_count_; }

 private:
  // Rows of C elements over the ep group. out: sends each rank the rows of
  // its experts (rows ordered by global expert), receives rows ordered by
  // source rank, then local expert; !out: the reverse.
  void exchange(core::CPtr send, core::Ptr recv, bool out);
  // Rows ordered by source rank, then local expert, copied to the local
  // experts' slots (expert el's rows from every source contiguous from row
  // el x ep x capacity), or (to_experts false) back.
  void regroup(core::Ptr by_source, core::Ptr by_expert, bool to_experts) const;

  MoeConfig c_;
  ExpertSeam* ep_;
  int N_, cap_, El_;  // El_: experts on this rank
  std::vector<int> topk_, slot_, count_, routed_, tok_;  // tok_[e * cap + s]: the token in that slot
  std::vector<int> pos_;                   // [E]: first row of expert e in the packed rows this rank sends
  std::vector<int> recv_count_;            // [ep, El]: rows from each source for each local expert
  std::vector<int> expert_rows_;           // [El]: rows each local expert took
  std::vector<std::int64_t> out_counts_, out_displs_, in_counts_, in_displs_;  // per ep rank, in elements
  std::vector<float> gate_;                // [N, k]
  // Host copies for the routing, dispatch and combine, which run on the
  // host in fp32 whatever the device (untracked host memory; on a GPU each is
  // one copy per layer and pass): the probabilities [N, E], the layer's
  // input or output gradient [N, C], the rows sent [slots, C] and the
  // outputs back.
  std::vector<float> hprobs_, hrows_, hsend_, hyback_;
  std::vector<double> mass_, first_share_; // per expert
  int dropped_ = 0;
  float aux_ = 0;
  // See moe_buffers: probs [N, E]; packed rows sent and received and the
  // outputs that came back (slots x C); the local experts' input rows, hidden
  // activations before (F' wide) and after the activation (F wide) and
  // outputs; backward scratch of the same shapes.
  Buffers bufs_;
  core::Ptr probs_, send_, recv_, yback_, xin_, hpre_, h_, yout_, dyout_, dh_, dhpre_, dxin_, dlogits_;
};

}  // namespace strata::models
