// The step simulator: a discrete-event executor that replays each pipeline
// stage's trace (kernels/foundation/trace.hpp: the step as the real code ran
// it on the meta device, schedule and all) with durations from a machine
// description. It is the unit-cost executor of pipeline_sim.hpp grown up:
// the same loop over per-rank programs in which a receive waits for its
// send, now with every kernel, collective and wait in it.
//
// Durations (docs/machines.md):
//   kernel      launch latency + max(matrix FLOPs / (peak x efficiency by
//               shape) + other FLOPs / vector rate, bytes / memory
//               bandwidth), times the kernel's measured factor if calibrated;
//   collective  by group size and network level (whether the group's ranks
//               share a node): a calibrated fit for the op and size, else
//               ring steps x latency + bytes x the bus factor / bandwidth,
//               where across nodes a group gets the NIC share of its
//               members on each node;
//   non-blocking calls progress in the background at the machine's overlap
//               share, serially per axis; a wait takes what is left; while
//               any moves beside the rank's kernels (sends too), they run
//               1 + (compute_slowdown - 1) x overlap times slower.
// Ranks with identical work are simulated once: one rank per pipeline stage
// (the stage's first), whose collectives inside the stage need no partner;
// collectives spanning stages (pp, emb, world) meet when every stage has
// reached them, and a receive waits for its send's arrival.
#pragma once

#include <string>
#include <vector>

#include "kernels/foundation/precision.hpp"
#include "kernels/foundation/timeline.hpp"
#include "kernels/foundation/trace.hpp"
#include "src/comm/comm_log.hpp"
#include "src/mesh/mesh.hpp"
#include "src/sim/machine.hpp"

namespace strata::sim {

// One kernel's predicted duration.
double kernel_time(const Machine& m, const prof::TraceEvent& kernel, core::Precision p);
// One collective's predicted duration over the world ranks `group` (bytes as
// the /comm table counts them).
// An offload transfer's duration: axis "host" (device <-> host copies, at
// the host link's bandwidth, or a memory copy where they share memory) or
// "nvme" (the optimizer file).
double transfer_time(const Machine& m, const std::string& axis, double bytes);
// What a call's time depends on of its group: its size, whether it spans
// nodes and the most members on one node (its share of that node's NICs).
struct GroupShape {
  GroupShape() = default;  // (not an aggregate: a braced list of ranks is a group, not a shape)
  int n = 0;
  bool across = false;
  int most = 0;
  int first = 0, last = 0;  // the lowest and highest member, for messages
};
GroupShape group_shape(const Machine& m, const std::vector<int>& group);
// `nonblocking` picks a calibrated fit of the op's non-blocking form, where there is one.
double comm_time(const Machine& m, const std::string& op, const GroupShape& group, double bytes,
                 bool nonblocking = false);
double comm_time(const Machine& m, const std::string& op, const std::vector<int>& group, double bytes,
                 bool nonblocking = false);

struct StageTiming {
  int rank = 0;            // the world rank simulated: the stage's first unless SimOptions::ranks says
  double end = 0;          // when its step's last event finished (s from the step's start)
  double compute = 0;      // summed kernel time, slowed where communication moved beside it
  double slowed = 0;       // of which the slowdown (Machine::compute_slowdown)
  double comm_wait = 0;    // time blocked in communication: the exposed part
  std::vector<prof::Span> spans;        // step 0, times from the step's start
  std::vector<comm::CommRecord> comms;  // step 0, simulated times
};

struct StepSimulation {
  double step_time = 0;             // the last stage's end
  std::vector<StageTiming> stages;  // by pipeline stage
};

// What a replay may change: the rank each stage is simulated as, and axes
// whose calls take no time (counterfactuals: where a bubble comes from).
struct SimOptions {
  std::vector<int> ranks;              // per stage, a world rank on it (empty: each stage's first)
  std::vector<std::string> free_axes;  // their calls take no time; "*": every axis, offload's too
};

// `traces[s]` is stage s's simulated rank's step. Throws a runtime error if
// the programs cannot finish (a receive never sent: a broken trace).
StepSimulation simulate_step(const mesh::Layout& l, const std::vector<const prof::Trace*>& traces, const Machine& m,
                             core::Precision p, const SimOptions& options = {});

}  // namespace strata::sim
