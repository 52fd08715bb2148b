// Structural checks of a schedule, without running it: every (micro-batch,
// chunk) of a rank's stages has exactly one forward and one backward (or one
// backward-input and one backward-weight), in that order; every send has its
// receive, and the receives of each (sender, receiver, kind) come in the
// order of the sends; the optimizer step closes every list. Deadlock
// freedom and timing are the simulator's (src/sim/pipeline_sim.hpp).
#pragma once

#include <string>

#include "strategies/pp/schedule.hpp"

namespace strata::strategies::pp {

// "" when the schedule is well formed, else the first problem found.
// Transfers are matched by the global stages of `placement`.
std::string check_schedule(const Schedule& sched, const Shape& s, const Placement& placement = kInterleaved);

}  // namespace strata::strategies::pp
