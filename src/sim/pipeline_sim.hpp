// The unit-cost executor: runs a pipeline schedule's action lists as a
// discrete-event simulation in which compute takes fixed times and transfers
// are free. Sends never block; a receive waits until its send has happened.
// It finds deadlocks (no rank can move and some are unfinished) and gives
// each rank's busy time, end time and activation high-water mark, hence the
// bubble. It is the seed of the simulator: the same loop with measured
// durations instead of unit costs.
#pragma once

#include <string>
#include <vector>

#include "strategies/pp/schedule.hpp"

namespace strata::sim {

struct UnitCosts {
  double forward = 1, backward = 2, backward_input = 1, backward_weight = 1, optimizer = 0;
};

struct RankTiming {
  double busy = 0;       // summed compute
  double end = 0;        // when its last action finished
  int max_in_flight = 0; // most micro-batch chunks forwarded but not yet backwarded (input half)
  int max_alive = 0;     // most micro-batch chunks forwarded whose weight gradient is not yet done
                         // (what a stage must keep activations for)
};

struct PipelineRun {
  std::string deadlock;  // empty when every rank finished; else what each blocked rank waits for
  std::vector<RankTiming> ranks;
  double makespan = 0;   // the step: the last end over ranks
  // Idle over step time, the convention of the (p-1)/(m+p-1) formulas.
  double bubble(int r) const { return makespan > 0 ? 1.0 - ranks[r].busy / makespan : 0.0; }
};

PipelineRun simulate(const strategies::pp::Schedule& sched, const UnitCosts& costs = {});

}  // namespace strata::sim
