// The unit-cost executor: runs a pipeline schedule's action lists as a
// discrete-event simulation in which compute takes fixed times and transfers
// are free. Sends never block; a receive waits until its send has happened.
// It finds deadlocks (no rank can move and some are unfinished) and gives
// each rank's busy time, end time and activation high-water mark, hence the
// bubble. The step simulator (src/sim/simulator.hpp) runs the same loop
// with durations from a machine description instead of unit costs.
#pragma once

#include <string>
#include <vector>

#include "strategies/pp/liveness.hpp"
#include "strategies/pp/schedule.hpp"

namespace strata::sim {

struct UnitCosts {
  double forward = 1, backward = 2, backward_input = 1, backward_weight = 1, optimizer = 0;
};

struct RankTiming {
  double busy = 0;       // summed compute
  double end = 0;        // when its last action finished
  int max_in_flight = 0; // most micro-batch chunks forwarded but not yet backwarded (input half)
  int max_alive = 0;     // most (chunk, micro-batch) pairs live at once, from their first action to
                         // their last (strategies/pp/liveness.hpp): the stage models the rank holds
};

struct PipelineRun {
  std::string deadlock;  // empty when every rank finished; else what each blocked rank waits for
  std::vector<RankTiming> ranks;
  double makespan = 0;   // the step: the last end over ranks
  // Idle over step time, the convention of the (p-1)/(m+p-1) formulas.
  double bubble(int r) const { return makespan > 0 ? 1.0 - ranks[r].busy / makespan : 0.0; }
};

// With `bounded_slots`, as the real executor runs: each rank has the stage
// models its action list's liveness asks for (strategies/pp/liveness.hpp),
// a pair's model is free again only once every send of its last actions
// has been received, and a rank that starts a pair when none is free waits
// for that. Without, sends never hold anything up.
PipelineRun simulate(const strategies::pp::Schedule& sched, const UnitCosts& costs = {}, bool bounded_slots = false);

}  // namespace strata::sim
