// The registry: one table of rows per seam (layer, schedule, state), each
// row one strategy, and everything the strategy is, declared by its row:
// its name, the deck keys it owns (type, range or allowed values, default,
// doc: strategies/keys.hpp), the checks between them and the rest of the
// plan, the mesh dims and groups it works over (strategies/axes.hpp), what
// it adds to a run's parallel pieces (strategies/parallelize.hpp), what
// `strata plan` may vary of it, and what it costs, for people. The pairs
// that do not compose stand in one table beside the rows (conflicts()).
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
#include "plan/keys.hpp"
#include "strategies/parallelize.hpp"
#include "strategies/pp/schedule.hpp"
#include "plan/checks.hpp"
#include "strategies/state_strategy.hpp"

namespace strata::strategies {

using plan::PlanCheck;
using plan::PlanChecks;

// What `strata plan` may vary: one key of a row, and the values to try for
// it given the candidate built so far on `world` devices, `per_node` to a
// node (the keys of earlier searches set, every later one at a default
// Plan's value). A row offers only values its own constraints allow; the
// deck's checks and the conflicts judge the candidate. Searches run in
// `order`; a `fit` search's values are tried in turn, the least costly
// first, until the candidate fits (recomputation, offload).
struct Space {
  int world = 1;
  int per_node = 1;
};
struct Search {
  int order = 0;
  std::string_view key;  // "parallel.tp"
  std::vector<std::string> (*values)(const Space&, const plan::Plan& so_far) = nullptr;  // plan::value_of's text
  bool fit = false;
  // How a candidate's label shows it ("tp"), and the value it leaves unsaid.
  std::string_view label = {};
  std::string_view unsaid = {};
};

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
  std::vector<Search> search = {};  // what `strata plan` may vary of it
};

// Strategies (and model features) that do not compose: each pair once, the
// keys that choose them, when a plan chooses both, and the message, whose
// {0}, {1}, ... show those keys with where their values came from. Checked
// with every row's own checks (check_plan).
struct Conflict {
  std::string_view a, b;
  std::vector<std::string_view> keys;
  bool (*when)(const plan::Plan&) = nullptr;
  std::string_view message;
};
const std::vector<Conflict>& conflicts();

// A state strategy: where parameters, gradients and optimizer state live.
// The plan chooses exactly one (`chosen`); `make` builds it over a group;
// `label` is what a report calls it for a plan ("dp", "zero2").
struct StateRow : Row {
  bool (*chosen)(const plan::Plan&) = nullptr;
  StateFactory make = nullptr;
  std::string (*label)(const plan::Plan&) = nullptr;
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

// Every row's checks, then the conflicts, on a resolved plan.
void check_plan(const plan::Plan& p, PlanChecks& checks);

// Every row's searches, in their order.
std::vector<const Search*> searches();

// The devices of `p`'s layout not yet given to a dim: `world` over the
// product of its dims (a search's share before it divides them).
int devices_left(const Space& s, const plan::Plan& p);
// The most ranks a layout may have (checked by check_plan): twenty times the
// largest training jobs run, and what one process estimates and simulates
// in about a minute; past it the dims' product would near an int's range.
constexpr int kMaxWorld = 1 << 20;
// The divisors of n.
std::vector<int> divisors(int n);

// The mesh a plan asks for: every row's dims and groups (Row::axes), in the
// rows' order; or those of `rows` (a test's own beside the registry's).
mesh::Layout layout_of(const plan::Plan& p);
mesh::Layout layout_of(const plan::Plan& p, const std::vector<const Row*>& rows);

}  // namespace strata::strategies
