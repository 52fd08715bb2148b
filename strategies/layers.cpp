// The layer seam's rows: how a layer computes across ranks. Tensor and
// sequence parallelism (Megatron-LM), expert parallelism (GShard), and
// activation recomputation, which trades a layer's memory for its forward
// work again. The layers themselves are the model families' (models/decoder/)
// and models/moe.cpp, written once against the layer seams
// (models/seams.hpp); their parallel forms are strategies/tp.cpp and
// strategies/ep.cpp.
#include <fmt/format.h>

#include "plan/plan.hpp"
#include "strategies/cp.hpp"
#include "strategies/ep.hpp"
#include "strategies/registry.hpp"
#include "strategies/tp.hpp"

namespace strata::strategies {

namespace {

using plan::key, plan::Plan, plan::ParallelSection, plan::ModelSection;

// Heads, the MLP's hidden units and the vocabulary split over tp ranks; with
// sequence parallelism the tokens too.
void check_tp(const Plan& p, PlanChecks& checks) {
  const auto& m = p.model;
  const int tp = p.parallel.tp;
  if (m.heads % tp != 0)
    checks.error({"model.heads", "parallel.tp"},
                 fmt::format("{} is not a multiple of {}: tensor parallelism splits the attention heads over tp ranks",
                             checks.show("model.heads"), checks.show("parallel.tp")));
  // Grouped-query attention's key-value heads split the same way; with fewer
  // of them than tp ranks Megatron-LM refuses too (replicating a head on
  // several ranks is not done).
  else if (m.kv_heads > 0 && m.kv_heads % tp != 0)
    checks.error({"model.kv_heads", "parallel.tp"},
                 fmt::format("{} is not a multiple of {}: tensor parallelism splits the key-value heads over tp "
                             "ranks, as Megatron-LM does (a key-value head is not replicated over ranks)",
                             checks.show("model.kv_heads"), checks.show("parallel.tp")));
  if (m.vocab % tp != 0)
    checks.error({"model.vocab", "parallel.tp"},
                 fmt::format("{} is not a multiple of {}: the embedding and the logits are split by vocabulary over "
                             "tp ranks",
                             checks.show("model.vocab"), checks.show("parallel.tp")));
  if (p.parallel.sequence_parallel && m.seq_len % tp != 0)
    checks.error({"model.seq_len", "parallel.tp", "parallel.sequence_parallel"},
                 fmt::format("{} is not a multiple of {}: sequence parallelism splits the sequence over tp ranks",
                             checks.show("model.seq_len"), checks.show("parallel.tp")));
}

// The ep ranks holding different experts are part of each dp group; each
// holds experts / ep whole experts.
void check_ep(const Plan& p, PlanChecks& checks) {
  const int ep = p.parallel.ep, experts = p.model.moe_experts;
  if (p.parallel.dp % ep != 0)
    checks.error({"parallel.ep", "parallel.dp"},
                 fmt::format("{} does not divide {}: the ep ranks holding different experts are a part of each "
                             "data-parallel group",
                             checks.show("parallel.ep"), checks.show("parallel.dp")));
  if (experts > 0 && experts % ep != 0)
    checks.error({"model.moe_experts", "parallel.ep"},
                 fmt::format("{} is not a multiple of {}: each expert-parallel rank holds experts / ep whole experts",
                             checks.show("model.moe_experts"), checks.show("parallel.ep")));
}

void tp_axes(const Plan& p, mesh::Layout& l) {
  mesh::add_dim(l, {.name = "tp", .size = p.parallel.tp, .nest = 400, .doc = "tensor-parallel index"});
  mesh::add_group(l, {.name = "tp", .dims = {"tp"}, .doc = "tensor (and sequence) parallelism's collectives"});
}

void tp_parts(const Plan& p, const MeshGroups& mesh, Parallel& out) {
  comm::Communicator* tp = several(mesh.group("tp"));
  out.tp = make_tensor_seam(tp, p.parallel.sequence_parallel);
  if (tp != nullptr) out.norm.push_back(tp);
}

// The ep ranks of each dp group hold different experts; the dp / ep ranks
// at the same place in each ep group hold the same ones.
void ep_axes(const Plan& p, mesh::Layout& l) {
  using Cut = mesh::Group::Cut;
  const int ep = p.parallel.ep;
  mesh::add_group(l, {.name = "ep", .dims = {"dp"}, .cut = Cut::within, .block = ep, .shown = ep > 1,
                      .doc = "the ranks holding different experts: the MoE all-to-alls"});
  mesh::add_group(l, {.name = "edp", .dims = {"dp"}, .cut = Cut::across, .block = ep, .same_params = true,
                      .shown = ep > 1, .doc = "the ranks holding the same experts: their gradient and ZeRO traffic"});
}

void ep_parts(const Plan&, const MeshGroups& mesh, Parallel& out) {
  comm::Communicator* ep = several(mesh.group("ep"));
  out.ep = make_expert_seam(ep);
  if (ep == nullptr) return;
  out.experts = ep;
  out.expert_data = mesh.group("edp");
}

// tp inside a node, dividing the heads and the vocabulary; sequence
// parallelism with it or not.
std::vector<std::string> tp_sizes(const Space& s, const Plan& p) {
  std::vector<std::string> out;
  for (int tp : divisors(devices_left(s, p)))
    if (tp <= s.per_node && p.model.heads % tp == 0 && p.model.kv_heads % tp == 0 && p.model.vocab % tp == 0)
      out.push_back(std::to_string(tp));
  return out;
}
std::vector<std::string> sp_choices(const Space&, const Plan& p) {
  if (p.parallel.tp == 1) return {"false"};
  return {"false", "true"};
}

// Expert parallelism for a MoE model: each ep rank whole experts.
std::vector<std::string> ep_sizes(const Space&, const Plan& p) {
  if (p.model.moe_experts == 0) return {"1"};
  std::vector<std::string> out;
  for (int ep : divisors(p.parallel.dp))
    if (p.model.moe_experts % ep == 0) out.push_back(std::to_string(ep));
  return out;
}

std::vector<std::string> recompute_choices(const Space&, const Plan&) {
  return {"none", "selective", "full", "op"};
}

}  // namespace

const std::vector<Row>& layer_rows() {
  static const std::vector<Row> rows = {
      {"tp",
       "tensor parallelism (Megatron-LM): column- and row-parallel linears, vocabulary-parallel embedding and "
       "cross-entropy; with sequence parallelism the norms and residual stream hold 1/tp of the tokens",
       {key<&Plan::parallel, &ParallelSection::tp>("parallel", "tp", "tensor-parallel ranks per layer").at_least(1),
        key<&Plan::parallel, &ParallelSection::sequence_parallel>(
            "parallel", "sequence_parallel",
            "shard the residual stream and the norms' outputs along the sequence over tp ranks (each norm's output "
            "kept as its shard and gathered again in the backward pass)")},
       tp_axes,
       check_tp,
       "parameters, gradients and optimizer state of the split tensors 1/tp; per block two all-reduces of b s h "
       "forward and two backward (with sequence parallelism, all-gather and reduce-scatter pairs of the same bytes, "
       "and the two norms' outputs, kept as 1/tp shards, gathered again backward), in the compute precision",
       tp_parts,
       {{10, "parallel.tp", tp_sizes, false, "tp"},
        {95, "parallel.sequence_parallel", sp_choices, false, "sp", "false"}}},
      {"ep",
       "expert parallelism (GShard): the experts of each MoE block split over ep ranks of each dp group, tokens "
       "dispatched and combined by all-to-all; expert state kept over the expert-data-parallel group",
       {key<&Plan::parallel, &ParallelSection::ep>(
            "parallel", "ep", "expert-parallel ranks: divides dp; each holds experts / ep of every MoE block")
            .at_least(1)},
       ep_axes,
       check_ep,
       "expert parameters and state 1/ep (sharded by ZeRO over dp / ep); per MoE block and micro-batch an "
       "all-to-all of E int32 counts and all_to_allv of the routed rows out and back, each way, in the compute "
       "precision",
       ep_parts,
       {{50, "parallel.ep", ep_sizes, false, "ep", "1"}}},
      context_parallel_row(),
      {"recompute",
       "activation recomputation: selective rebuilds the attention probabilities from q and k in the backward "
       "pass (Korthikanti et al., 2022; Megatron-LM's); full rebuilds each block's forward from its stored input; "
       "op keeps what torchtitan's per-op policy keeps (every second matmul's output and attention's outputs)",
       {key<&Plan::model, &ModelSection::recompute>(
            "model", "recompute",
            "activation recomputation: none; selective (attention probabilities rebuilt in the backward pass); full "
            "(each block's forward rebuilt from its input); op (torchtitan's per-op policy: q, v, attention's "
            "output, the MLP's first linear (SwiGLU: its gate half and the projection) kept, the rest rebuilt)")},
       nullptr,
       nullptr,
       "per block and micro-batch, the activations of docs/costs.md's table for the mode; what is rebuilt is one "
       "block's worth of scratch per rank, shared; hardware FLOPs add the forward work recomputed",
       nullptr,
       {{210, "model.recompute", recompute_choices, true, "recompute", "none"}}},
  };
  return rows;
}

}  // namespace strata::strategies
