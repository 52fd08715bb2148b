// The pairs that do not compose, in one table: what a strategy refuses of
// another (or of a model feature) is here, not in either's checks, so that
// it is stated once and read by everything that checks a plan (the deck,
// and through it `strata plan`).
#include "plan/plan.hpp"
#include "strategies/registry.hpp"

namespace strata::strategies {

namespace {

using plan::Plan;

bool hybrid(const Plan& p) { return p.parallel.dp_shard != 0 && p.parallel.dp_shard != p.parallel.dp; }
bool moe(const Plan& p) { return p.model.moe_experts > 0; }

}  // namespace

const std::vector<Conflict>& conflicts() {
  static const std::vector<Conflict> table = {
      {"ep", "a dense model", {"parallel.ep", "model.moe_experts"},
       [](const Plan& p) { return p.parallel.ep > 1 && !moe(p); },
       "{0} needs a Mixture-of-Experts model (model.kind = \"moe\", model.moe_experts >= 1); {1}"},
      {"cp", "moe", {"parallel.cp", "model.moe_experts"}, [](const Plan& p) { return p.parallel.cp > 1 && moe(p); },
       "{0} with a Mixture-of-Experts model ({1}): a MoE layer routes, caps and balances the tokens of a "
       "micro-batch, which context parallelism would split; use cp = 1"},
      {"cp", "unfused attention", {"parallel.cp", "model.attention"},
       [](const Plan& p) { return p.parallel.cp > 1 && p.composed_attention(); },
       "{0} with {1} on cuda: ring attention's blocks keep no scores; use model.attention = \"fused\" (or \"auto\")"},
      {"cp", "hybrid sharding", {"parallel.cp", "parallel.dp_shard"},
       [](const Plan& p) { return p.parallel.cp > 1 && hybrid(p); },
       "{0} with {1}: ZeRO shards over dp x cp under context parallelism; hybrid sharding does not cut that group "
       "(dp_shard = 0)"},
      {"hybrid sharding", "ep", {"parallel.dp_shard", "parallel.ep"},
       [](const Plan& p) { return hybrid(p) && p.parallel.ep > 1; },
       "{0} with {1}: hybrid sharding does not cut the expert-data-parallel groups; use dp_shard = 0 with expert "
       "parallelism"},
      {"a zero-bubble schedule", "recompute", {"model.recompute", "parallel.schedule"},
       [](const Plan& p) {
         return p.parallel.pp > 1 && p.parallel.schedule->split_backward && p.model.recompute != plan::Recompute::none;
       },
       "{0} with {1}: the zero-bubble schedule keeps every block's activations until the weight half of its "
       "backward, which recomputation would have overwritten; use another schedule or recompute = \"none\""},
  };
  return table;
}

}  // namespace strata::strategies
