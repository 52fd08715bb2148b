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
#pragma once

#include <cstdint>
#include <vector>

#include "src/core/memory.hpp"

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
};

// Tokens an expert takes from a group of `tokens`: ceil(capacity_factor x
// tokens x top_k / experts), or all of them without dropping.
int moe_capacity(const MoeConfig& c, int tokens);

// Parameter views: the router [E, C] and the experts' weights laid out
// expert after expert ([E, F, C], [E, F], [E, C, F], [E, C]), as torch's
// nn.Linear stores each.
struct MoeParams {
  const float *router, *fc_w, *fc_b, *proj_w, *proj_b;
};
struct MoeGrads {
  float *router, *fc_w, *fc_b, *proj_w, *proj_b;
};

class MoeLayer {
 public:
  MoeLayer(const MoeConfig& c, int tokens, core::MemoryTracker& tracker);

  // y[N, C] = MoE(x[N, C]). Returns the auxiliary loss, aux_coef x E x
  // sum_e f_e P_e (f_e: share of the group's tokens whose first choice is e;
  // P_e: mean router probability of e), to be added to the training loss.
  float forward(float* y, const float* x, const MoeParams& p);
  // For the last forward: dx += d(loss)/dx and gradients += d(loss)/dparams,
  // where loss = sum(y * dy) + aux_scale x the auxiliary loss.
  void backward(float* dx, const float* dy, const float* x, const MoeParams& p, const MoeGrads& g, float aux_scale);

  // Routing of the last forward.
  const MoeConfig& config() const { return c_; }
  int capacity() const { return cap_; }
  const std::vector<int>& routed() const { return routed_; }    // assignments per expert, before dropping
  const std::vector<int>& kept() const { return count_; }       // assignments per expert that fit
  int dropped() const { return dropped_; }                      // assignments past capacity
  float aux() const { return aux_; }                            // the auxiliary loss
  const std::vector<double>& prob_mass() const { return mass_; }  // sum of router probabilities per expert
  const std::vector<int>& choices() const { return topk_; }     // [N, k] expert of each choice
  const std::vector<int>& slots() const { return slot_; }       // [N, k] slot in its expert, -1 if dropped

 private:
  MoeConfig c_;
  int N_, cap_;
  std::vector<int> topk_, slot_, count_, routed_, tok_;  // tok_[e * cap + s]: the token in that slot
  std::vector<float> gate_;                              // [N, k]
  std::vector<double> mass_, first_share_;               // per expert
  int dropped_ = 0;
  float aux_ = 0;
  // probs [N, E]; per expert and slot: input rows, hidden pre- and post-GELU,
  // output rows; backward scratch of the same shapes.
  core::Buffer<float> probs_, xin_, hpre_, h_, yout_, dyout_, dh_, dxin_, dhpre_, dgate_, dlogits_;
};

}  // namespace strata::models
