// The Llama family's row: model.kind "llama" (Llama 2 and 3; with
// moe_experts > 0, Mixtral's MoE blocks), its [model] keys and checks, and
// how it builds a stage model and counts its parameters and FLOPs. The
// model is the decoder (models/decoder/) in Llama's form.
#include "models/llama/family.hpp"

#include <fmt/format.h>

#include <limits>

namespace strata::models {

namespace {

using plan::key, plan::Plan, plan::ModelSection, plan::PlanChecks;

std::vector<plan::KeySpec> llama_keys() {
  std::vector<plan::KeySpec> k = {
      key<&Plan::model, &ModelSection::kv_heads>(
          "model", "kv_heads",
          "key-value heads of grouped-query attention, dividing heads (heads: multi-head, 1: multi-query); 0: heads")
          .at_least(0),
      key<&Plan::model, &ModelSection::ffn_dim>(
          "model", "ffn_dim", "hidden units of the SwiGLU MLP; 0: 8 d_model / 3 rounded up to a multiple of 256")
          .at_least(0),
      key<&Plan::model, &ModelSection::rope_theta>("model", "rope_theta",
                                                    "base of the rotary position embedding's angles")
          .above(0),
      key<&Plan::model, &ModelSection::tie_embeddings>("model", "tie_embeddings",
                                                        "the output head shares the token embedding's weights")};
  for (const plan::KeySpec& s : moe_block_keys()) k.push_back(s);
  return k;
}

long long ffn_of(const ModelSection& m) { return m.ffn_dim > 0 ? m.ffn_dim : llama_ffn_dim(m.d_model); }

void check_llama(const Plan& p, PlanChecks& checks) {
  const ModelSection& m = p.model;
  const int kv = m.kv_heads > 0 ? m.kv_heads : m.heads;
  if (m.heads % kv != 0)
    checks.error({"model.kv_heads", "model.heads"},
                 fmt::format("{} does not divide {}: each key-value head serves heads / kv_heads query heads",
                             checks.show("model.kv_heads"), checks.show("model.heads")));
  if (m.heads > 0 && m.d_model % m.heads == 0 && (m.d_model / m.heads) % 2 != 0)
    checks.error({"model.d_model", "model.heads"},
                 fmt::format("the head size {} / {} = {} is odd: rotary positions turn pairs of a head's channels",
                             checks.show("model.d_model"), checks.show("model.heads"), m.d_model / m.heads));
  if (ffn_of(m) > std::numeric_limits<int>::max())
    checks.error({"model.ffn_dim", "model.d_model"},
                 fmt::format("the MLP width {} exceeds {} ({}, {})", ffn_of(m), std::numeric_limits<int>::max(),
                             checks.show("model.ffn_dim"), checks.show("model.d_model")));
  else if (ffn_of(m) % p.parallel.tp != 0)
    checks.error({"model.ffn_dim", "parallel.tp"},
                 fmt::format("the MLP width {} is not a multiple of {}: tensor parallelism splits its hidden units "
                             "over tp ranks ({})",
                             ffn_of(m), checks.show("parallel.tp"), checks.show("model.ffn_dim")));
  check_moe_blocks(p, checks);
}

std::unique_ptr<Model> make_llama(const Plan& p, const Build& b) {
  return std::make_unique<Decoder>(llama_config(p), b.micro_batch, *b.tracker, b.seams, b.stage, b.split_backward,
                                   b.scratch);
}

long double parameters(const Plan& p) { return decoder_param_count(llama_config(p)); }
double model_flops(const Plan& p, int sequences) { return decoder_model_flops(llama_config(p), sequences); }
double hardware_flops(const Plan& p, int sequences) { return decoder_hardware_flops(llama_config(p), sequences); }

}  // namespace

long long llama_ffn_dim(long long d_model) { return (8 * d_model / 3 + 255) / 256 * 256; }

DecoderConfig llama_config(const Plan& p) {
  const ModelSection& m = p.model;
  DecoderConfig c = decoder_config(p);
  c.kv_heads = m.kv_heads;
  c.ffn_dim = int(ffn_of(m));
  c.norm = Norm::rms;
  c.act = Activation::swiglu;
  c.bias = false;
  c.rope_theta = float(m.rope_theta);
  c.tie_embeddings = m.tie_embeddings;
  return c;
}

Family llama_family() {
  return {"llama",
          "Llama blocks: RMSNorm, grouped-query attention with rotary positions, a SwiGLU MLP, no biases, an untied "
          "head; with moe_experts > 0, Mixtral's MoE blocks of SwiGLU experts",
          llama_keys(), check_llama, make_llama, parameters, model_flops, hardware_flops};
}

}  // namespace strata::models
