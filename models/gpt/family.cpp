// The GPT family's rows: model.kind "gpt" (dense) and "moe" (the MLPs of
// every moe_every-th block replaced by a Mixture-of-Experts layer), their
// [model] keys and checks, and how they build a stage model and count its
// parameters and FLOPs.
#include <fmt/format.h>

#include <limits>

#include "models/gpt/gpt.hpp"
#include "models/gpt/family.hpp"

namespace strata::models {

namespace {

using plan::key, plan::Plan, plan::ModelSection, plan::PlanChecks;

std::vector<plan::KeySpec> mlp_keys() {
  return {key<&Plan::model, &ModelSection::ffn_mult>("model", "ffn_mult", "MLP hidden width as a multiple of d_model")
              .at_least(1)};
}

std::vector<plan::KeySpec> moe_keys() {
  std::vector<plan::KeySpec> k = mlp_keys();
  for (plan::KeySpec s : {
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
               .at_least(0)})
    k.push_back(s);
  return k;
}

// The MLP's width is an int.
void check_width(const Plan& c, PlanChecks& checks) {
  using R = long double;
  const R F = R(c.model.ffn_mult) * c.model.d_model;
  if (F > R(std::numeric_limits<int>::max()))
    checks.error({"model.ffn_mult", "model.d_model"},
                 fmt::format("the MLP width {} x {} = {:.4g} exceeds {}", checks.show("model.ffn_mult"),
                             checks.show("model.d_model"), double(F), std::numeric_limits<int>::max()));
}

void check_gpt(const Plan& c, PlanChecks& checks) {
  check_width(c, checks);
  if (c.model.moe_experts > 0)
    checks.error({"model.moe_experts", "model.kind"},
                 fmt::format("{} needs model.kind = \"moe\" ({})", checks.show("model.moe_experts"),
                             checks.show("model.kind")));
}

void check_moe(const Plan& c, PlanChecks& checks) {
  check_width(c, checks);
  if (c.model.moe_experts == 0)
    checks.error({"model.kind", "model.moe_experts"},
                 fmt::format("{} needs model.moe_experts >= 1 ({})", checks.show("model.kind"),
                             checks.show("model.moe_experts")));
  else if (c.model.moe_top_k > c.model.moe_experts)
    checks.error({"model.moe_top_k", "model.moe_experts"},
                 fmt::format("{} exceeds {}: a token is routed to top_k distinct experts", checks.show("model.moe_top_k"),
                             checks.show("model.moe_experts")));
}

std::unique_ptr<Model> make_gpt(const Plan& p, const Build& b) {
  return std::make_unique<Gpt>(gpt_config(p), b.micro_batch, *b.tracker, b.seams, b.stage, b.split_backward);
}

long double parameters(const Plan& p) { return gpt_param_count(gpt_config(p)); }
double model_flops(const Plan& p, int sequences) { return gpt_model_flops(gpt_config(p), sequences); }
double hardware_flops(const Plan& p, int sequences) { return gpt_hardware_flops(gpt_config(p), sequences); }

}  // namespace

Family gpt_family() {
  return {"gpt",    "GPT-2 blocks: LayerNorm, attention and a GELU MLP; the head tied to the embedding",
          mlp_keys(), check_gpt, make_gpt, parameters, model_flops, hardware_flops};
}

Family moe_family() {
  return {"moe",
          "GPT-2 blocks whose MLP, in every moe_every-th block, is a Mixture-of-Experts layer (top-k routing, "
          "capacity, load-balancing loss)",
          moe_keys(), check_moe, make_gpt, parameters, model_flops, hardware_flops};
}

}  // namespace strata::models
