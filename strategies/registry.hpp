// The registry: one table of rows per seam (layer, schedule, state), each
// row one strategy. A row names the strategy, the deck keys it owns (type,
// range or allowed values, default, doc: strategies/keys.hpp), the checks
// between them and the rest of the plan, the mesh axes it works over, and
// what it costs, for people. The deck's key table and cross-key checks are
// the global ones and the rows' (src/deck); the trainer builds a state
// strategy with its row's factory and a pipeline from its schedule's row.
//
// Costs are declared once, by the code: the buffers a strategy allocates and
// the collectives it issues are its declaration, and the dry run measures
// them by running a step on the meta device (src/train/estimate.hpp), which
// the tests hold equal to what runs measure. A row's `costs` is the same
// fact as a formula for people (ZeRO-2: 4 Psi + 12 Psi / N), which the
// tests also check against the run; nothing computes from it.
//
// Adding a strategy: its file (the implementation and its row), and the row
// in its seam's table: state_rows() (strategies/registry.cpp),
// layer_rows() (strategies/layers.cpp), pp::schedules()
// (strategies/pp/schedule.cpp). See docs/architecture.md.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "models/nvme.hpp"
#include "strategies/axes.hpp"
#include "strategies/keys.hpp"
#include "strategies/parallelize.hpp"
#include "strategies/plan_checks.hpp"
#include "strategies/state_strategy.hpp"

namespace strata::strategies {

struct Row {
  std::string_view name = {};
  std::string_view doc = {};
  std::vector<plan::KeySpec> keys = {};  // the deck keys it owns
  // The mesh dims and groups it works over, at the plan's sizes
  // (strategies/axes.hpp): declared whatever the plan chooses, so every
  // layout has every axis (of one rank where a strategy is off).
  void (*axes)(const plan::Plan&, mesh::Layout&) = nullptr;
  PlanCheck check = nullptr;  // constraints between its keys and the plan
  std::string_view costs = {};  // what it holds and moves, for people
  // What it adds to a run's parallel pieces (strategies/parallelize.hpp):
  // its seam, its groups' parts in the state and the loss.
  void (*compose)(const plan::Plan&, const MeshGroups&, Parallel&) = nullptr;
};

// A state strategy: where parameters, gradients and optimizer state live.
// The plan chooses exactly one (`chosen`); `make` builds it over a group.
struct StateRow : Row {
  bool (*chosen)(const plan::Plan&) = nullptr;
  StateFactory make = nullptr;
};

// The seams' tables.
const std::vector<StateRow>& state_rows();
const std::vector<Row>& layer_rows();  // how a layer computes across ranks
const Row& pipeline_row();             // the pipeline executor (pp::schedules() are its schedules)
const Row& offload_row();              // where the optimizer state lives: device, host, NVMe

// The state row the plan chooses (a runtime error if none or several do).
const StateRow& chosen_state(const plan::Plan& p);

// What the offload row opens for a plan: the HostOffload the state
// strategy's optimizers take (no host arena without offload) and, with
// NVMe, the rank's file (on the meta device, regions without a file).
struct OffloadSetup {
  models::HostOffload offload;
  std::unique_ptr<models::NvmeFile> file;
};
OffloadSetup open_offload(const plan::Plan& p, core::MemoryTracker& host, models::OffloadStats* stats);

// Every row, in the order their keys, axes and parts are listed.
const std::vector<const Row*>& all_rows();

// Every row's checks on a resolved plan.
void check_plan(const plan::Plan& p, PlanChecks& checks);

// The mesh a plan asks for: every row's dims and groups (Row::axes), in the
// rows' order; or those of `rows` (a test's own beside the registry's).
mesh::Layout layout_of(const plan::Plan& p);
mesh::Layout layout_of(const plan::Plan& p, const std::vector<const Row*>& rows);

}  // namespace strata::strategies
