// The schedule seam's executor row: pipeline parallelism, its deck keys and
// the checks they need whatever the schedule (the stage split, the chosen
// schedule's shape and its own constraints). The schedules are pp::schedules()'s
// rows; the executor that runs their action lists is the trainer's
// (src/train/trainer.cpp, run_pipeline).
#include <algorithm>

#include <fmt/format.h>

#include "plan/plan.hpp"
#include "strategies/registry.hpp"

namespace strata::strategies {

namespace {

using plan::key, plan::Plan, plan::ParallelSection;

void check_pipeline(const Plan& c, PlanChecks& checks) {
  const auto& par = c.parallel;
  const int stages = par.pp * par.virtual_stages, first = par.first_stage_layers, last = par.last_stage_layers;
  const int fixed = (first >= 0) + (last >= 0), rest = c.model.layers - std::max(first, 0) - std::max(last, 0);
  if (fixed > 0 && par.pp == 1)
    checks.error({"parallel.first_stage_layers", "parallel.last_stage_layers"},
                 fmt::format("{} and {} split a pipeline; {} has one stage", checks.show("parallel.first_stage_layers"),
                             checks.show("parallel.last_stage_layers"), checks.show("parallel.pp")));
  else if (fixed == 0 && c.model.layers % stages != 0)
    checks.error({"model.layers", "parallel.pp", "parallel.virtual_stages"},
                 fmt::format("{} is not a multiple of {} x {}: every pipeline stage takes the same number of layers "
                             "(or set parallel.first_stage_layers / last_stage_layers)",
                             checks.show("model.layers"), checks.show("parallel.pp"),
                             checks.show("parallel.virtual_stages")));
  else if (fixed > 0 && (rest < 0 || (stages == fixed ? rest != 0 : rest % (stages - fixed) != 0 ||
                                                                        rest / (stages - fixed) < 1)))
    checks.error({"parallel.first_stage_layers", "parallel.last_stage_layers", "model.layers"},
                 fmt::format("{} with {} and {} leaves {} layer(s) for the other {} of {} x {} stages: they must "
                             "split evenly, at least one each",
                             checks.show("model.layers"), checks.show("parallel.first_stage_layers"),
                             checks.show("parallel.last_stage_layers"), rest, stages - fixed,
                             checks.show("parallel.pp"), checks.show("parallel.virtual_stages")));
  // Several chunks per rank: a schedule whose row runs virtual stages.
  const pp::ScheduleInfo& schedule = *par.schedule;
  std::string chunked;
  for (const auto& s : pp::schedules())
    if (s.virtual_stages) chunked += fmt::format("{}{}", chunked.empty() ? "" : " or ", s.name);
  if (par.virtual_stages != 1 && (!schedule.virtual_stages || par.pp == 1)) {
    checks.error({"parallel.virtual_stages", "parallel.schedule", "parallel.pp"},
                 fmt::format("{} needs the {} schedule with pp > 1 ({}, {}); other schedules hold one model chunk per "
                             "rank",
                             checks.show("parallel.virtual_stages"), chunked, checks.show("parallel.schedule"),
                             checks.show("parallel.pp")));
    return;
  }
  if (schedule.virtual_stages && par.pp > 1 && par.virtual_stages < 2) {
    checks.error({"parallel.virtual_stages", "parallel.schedule"},
                 fmt::format("{} needs {} >= 2 model chunks per pipeline rank (with one chunk per rank it is "
                             "1f1b for interleaved, zb-h1 for zb-v)",
                             checks.show("parallel.schedule"), checks.show("parallel.virtual_stages")));
    return;
  }
  const auto& d = c.data;
  if (par.pp == 1 || d.global_batch % (d.micro_batch * par.dp) != 0) return;
  const std::string problem = pp::check_shape(schedule, {par.pp, c.micro_batches(), par.virtual_stages});
  if (!problem.empty())
    checks.error({"parallel.schedule", "parallel.pp"}, fmt::format("{}: {}", checks.show("parallel.schedule"), problem));
}

// The pp dim (slowest: stages span nodes), its group, and the emb group of
// the ranks holding the first and the last stage, which both hold the tied
// word embedding; the schedule's placement says which ranks those are.
void pp_axes(const Plan& c, mesh::Layout& l) {
  mesh::add_dim(l, {.name = "pp", .size = c.parallel.pp, .nest = 100, .doc = "pipeline stage"});
  mesh::add_group(l, {.name = "pp", .dims = {"pp"}, .doc = "the pipeline's sends and receives"});
  int first = 0, last = 0;
  if (c.parallel.pp > 1) {
    const pp::Shape s{c.parallel.pp, c.micro_batches(), c.parallel.virtual_stages};
    first = c.parallel.schedule->placement->rank_of(s, 0);
    last = c.parallel.schedule->placement->rank_of(s, s.p * s.v - 1);
  }
  mesh::add_group(l, {.name = "emb", .dims = {"pp"}, .only = {first, last}, .shown = false,
                      .doc = "the first and last pipeline stage, which both hold the tied embedding"});
}

void pp_parts(const Plan&, const MeshGroups& mesh, Parallel& out) {
  out.pp = several(mesh.group("pp"));
  if (out.pp == nullptr) return;
  out.norm.push_back(out.pp);
  out.emb = several(mesh.group("emb"));
}

// No more stages than blocks; every registered schedule with pp > 1, two
// chunks a rank where its row runs virtual stages.
std::vector<std::string> pp_sizes(const Space& s, const Plan& p) {
  std::vector<std::string> out;
  for (int pp : divisors(devices_left(s, p)))
    if (pp <= p.model.layers) out.push_back(std::to_string(pp));
  return out;
}
std::vector<std::string> schedule_choices(const Space&, const Plan& p) {
  if (p.parallel.pp == 1) return {"1f1b"};
  std::vector<std::string> out;
  for (const auto& row : pp::schedules()) out.push_back(row.name);
  return out;
}
std::vector<std::string> chunk_counts(const Space&, const Plan& p) {
  return {p.parallel.pp > 1 && p.parallel.schedule->virtual_stages ? "2" : "1"};
}

}  // namespace

const Row& pipeline_row() {
  static const Row row{
      "pp",
      "pipeline parallelism: the model cut into pp stages (pp x virtual_stages chunks) that run a schedule's "
      "action lists, activations sent forward and gradients back",
      {key<&Plan::parallel, &ParallelSection::pp>("parallel", "pp", "pipeline stages").at_least(1),
       key<&Plan::parallel, &ParallelSection::schedule>("parallel", "schedule", "pipeline schedule"),
       key<&Plan::parallel, &ParallelSection::virtual_stages>(
           "parallel", "virtual_stages", "model chunks per pipeline rank (interleaved and zb-v schedules)")
           .at_least(1),
       key<&Plan::parallel, &ParallelSection::first_stage_layers>(
           "parallel", "first_stage_layers",
           "transformer blocks on the first pipeline stage (beside the embedding); -1: as many as every stage")
           .at_least(-1),
       key<&Plan::parallel, &ParallelSection::last_stage_layers>(
           "parallel", "last_stage_layers",
           "transformer blocks on the last pipeline stage (beside the head and loss); -1: as many as every stage")
           .at_least(-1)},
      pp_axes,
      check_pipeline,
      "each rank its stages' parameters and one stage model (activations and scratch) per (chunk, micro-batch) "
      "its schedule keeps live (strategies/pp/liveness.hpp); sends and receives of b s h activations and gradients per micro-batch and stage boundary, "
      "in the compute precision",
      pp_parts,
      {{20, "parallel.pp", pp_sizes, false, "pp"},
       {80, "parallel.schedule", schedule_choices, false, "", "1f1b"},
       {81, "parallel.virtual_stages", chunk_counts, false, "v", "1"}}};
  return row;
}

}  // namespace strata::strategies
