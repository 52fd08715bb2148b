// The [model] keys of the decoder's Mixture-of-Experts blocks, which every
// family with MoE blocks owns (a key several families take is listed once).
#include <fmt/format.h>

#include "models/decoder/decoder.hpp"

namespace strata::models {

using plan::key, plan::Plan, plan::ModelSection, plan::PlanChecks;

std::vector<plan::KeySpec> moe_block_keys() {
  return {
      key<&Plan::model, &ModelSection::moe_experts>("model", "moe_experts",
                                                     "experts of each Mixture-of-Experts block; 0: a dense model")
          .at_least(0),
      key<&Plan::model, &ModelSection::moe_every>("model", "moe_every",
                                                   "every k-th block is a MoE block (blocks l with l % k == k - 1)")
          .at_least(1),
      key<&Plan::model, &ModelSection::moe_top_k>("model", "moe_top_k", "experts each token is routed to")
          .between(1, 2),
      key<&Plan::model, &ModelSection::moe_capacity_factor>(
          "model", "moe_capacity_factor", "expert capacity = ceil(factor x tokens x top_k / experts) per micro-batch")
          .above(0),
      key<&Plan::model, &ModelSection::moe_drop_tokens>(
          "model", "moe_drop_tokens", "drop assignments past an expert's capacity (false: no capacity limit)"),
      key<&Plan::model, &ModelSection::moe_renormalize>(
          "model", "moe_renormalize", "gates = top-k probabilities over their sum (false: the probabilities)"),
      key<&Plan::model, &ModelSection::moe_aux_coef>("model", "moe_aux_coef",
                                                      "weight of the load-balancing auxiliary loss")
          .at_least(0)};
}

void check_moe_blocks(const Plan& c, PlanChecks& checks) {
  // Blocks l with l % k == k - 1 are MoE blocks: with k past the layers
  // there are none, and the "MoE" model is a dense one.
  if (c.model.moe_experts > 0 && c.model.moe_every > c.model.layers)
    checks.error({"model.moe_every", "model.layers"},
                 fmt::format("{} leaves no Mixture-of-Experts block among {}: at most the layers (or "
                             "model.moe_experts = 0 for a dense model)",
                             checks.show("model.moe_every"), checks.show("model.layers")));
  if (c.model.moe_experts > 0 && c.model.moe_top_k > c.model.moe_experts)
    checks.error({"model.moe_top_k", "model.moe_experts"},
                 fmt::format("{} exceeds {}: a token is routed to top_k distinct experts", checks.show("model.moe_top_k"),
                             checks.show("model.moe_experts")));
}

}  // namespace strata::models
