// The GPT family's rows: model.kind "gpt" (dense) and "moe" (the MLPs of
// every moe_every-th block replaced by a Mixture-of-Experts layer), their
// [model] keys and checks, and how they build a stage model and count its
// parameters and FLOPs.
#include <fmt/format.h>

#include <limits>

#include "models/gpt/family.hpp"

#include "models/decoder/decoder.hpp"

namespace strata::models {

namespace {

using plan::key, plan::Plan, plan::ModelSection, plan::PlanChecks;

std::vector<plan::KeySpec> mlp_keys() {
  return {key<&Plan::model, &ModelSection::ffn_mult>("model", "ffn_mult", "MLP hidden width as a multiple of d_model")
              .at_least(1)};
}

std::vector<plan::KeySpec> moe_keys() {
  std::vector<plan::KeySpec> k = mlp_keys();
  for (const plan::KeySpec& s : moe_block_keys()) k.push_back(s);
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

void check_moe(const Plan& c, PlanChecks& checks) {
  check_width(c, checks);
  if (c.model.moe_experts == 0)
    checks.error({"model.kind", "model.moe_experts"},
                 fmt::format("{} needs model.moe_experts >= 1 ({})", checks.show("model.kind"),
                             checks.show("model.moe_experts")));
  else
    check_moe_blocks(c, checks);
}

std::unique_ptr<Model> make_gpt(const Plan& p, const Build& b) {
  return std::make_unique<Decoder>(gpt_config(p), b.micro_batch, *b.tracker, b.seams, b.stage, b.split_backward,
                                   b.scratch);
}

long double parameters(const Plan& p) { return decoder_param_count(gpt_config(p)); }
double model_flops(const Plan& p, int sequences) { return decoder_model_flops(gpt_config(p), sequences); }
double hardware_flops(const Plan& p, int sequences) { return decoder_hardware_flops(gpt_config(p), sequences); }

}  // namespace

// GPT-2's block is the decoder's default form.
DecoderConfig gpt_config(const Plan& p) { return decoder_config(p); }

Family gpt_family() {
  return {"gpt",    "GPT-2 blocks: LayerNorm, attention and a GELU MLP; the head tied to the embedding",
          mlp_keys(), check_width, make_gpt, parameters, model_flops, hardware_flops};
}

Family moe_family() {
  return {"moe",
          "GPT-2 blocks whose MLP, in every moe_every-th block, is a Mixture-of-Experts layer (top-k routing, "
          "capacity, load-balancing loss)",
          moe_keys(), check_moe, make_gpt, parameters, model_flops, hardware_flops};
}

}  // namespace strata::models
