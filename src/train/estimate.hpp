// The dry run's estimate: what every rank of a deck's layout holds over one
// step, per pool and category (held and peak), and the collectives it
// issues, computed in one process without launching the job. Each estimated
// rank runs real steps on the meta device (kernels/kernels.hpp): the trainer
// builds the rank's model chunks, stage models, state strategy and offload
// through the same code as a run, every buffer comes from the same tracker
// calls (with no memory behind them), and every collective goes through a
// profiled communicator of the right group size that moves nothing
// (src/comm/meta_communicator.hpp). The estimate is therefore the run's own
// accounting, not a second encoding of it; the tests hold it equal to what
// runs measure, rank by rank.
//
// Ranks are grouped into classes with identical figures. The ranks of one
// pipeline stage hold the same bytes when every shard is padded alike, so
// the first and the last rank of each stage are estimated; if they differ,
// every rank of the stage is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/foundation/trace.hpp"
#include "kernels/kernels.hpp"
#include "src/comm/comm_log.hpp"
#include "plan/plan.hpp"
#include "src/mesh/mesh.hpp"
#include "src/train/memory_figures.hpp"

namespace strata::train {

// One step's calls of one op on one axis, as a rank issues them.
struct CommVolume {
  std::string axis, op;
  int group_size = 1;
  std::int64_t calls = 0, bytes = 0;
  bool operator==(const CommVolume&) const = default;
};
// The calls of `step` in a rank's log, per (axis, op), in order of first use.
std::vector<CommVolume> comm_volumes(const std::vector<comm::CommRecord>& records, int step);

struct RankClass {
  std::vector<int> ranks;  // world ranks, ascending
  RankMemory memory;       // one step
  std::vector<CommVolume> comm;
  std::vector<kernels::WorkCost> compute;  // one step's kernels, per layer and phase
  prof::Trace trace;  // with_traces: the step as a program, of the class's first rank
  // The host memory a rank of the class keeps for its report's records
  // (src/train/records.hpp): a window of steps, written when it is full.
  double record_window_bytes = 0;
  int record_window_steps = 1;
};

struct Estimate {
  int world = 1;
  std::vector<RankClass> classes;  // by the first rank of each
  // Exceeding backend.memory_limit (device) or host_memory_limit (host) at
  // its peak: one line per class that does, naming it and the excess.
  std::vector<std::string> does_not_fit;
};

// One rank: its figures and, when given, its calls, its kernels' work and
// its trace, over its second step (the first builds what is made on first use).
// With `cls`, its record window too.
RankMemory estimate_rank(const plan::Plan& cfg, int rank, std::vector<CommVolume>* comm = nullptr,
                         std::vector<kernels::WorkCost>* compute = nullptr, prof::Trace* trace = nullptr,
                         RankClass* cls = nullptr);
// Every rank of the layout the deck implies (pp x dp x tp); with_traces,
// each class's trace too (what the simulator replays).
Estimate estimate(const plan::Plan& cfg, bool with_traces = false);

// "0-3,8" for a sorted list of ranks.
std::string rank_ranges(const std::vector<int>& ranks);

}  // namespace strata::train
