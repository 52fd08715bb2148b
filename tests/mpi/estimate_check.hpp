// What every parity layout also asserts: the dry run's estimate of this rank
// (src/train/estimate.hpp: the same step run on the meta device) equals what
// the run measured over its last step, per pool and category, held at the
// end and peak during it; and, given the rank's communication log, that the
// step's collectives are the estimated ones call for call and byte for byte
// (an exchange whose size follows the data, MoE's all_to_allv of tokens,
// call for call only).
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "src/comm/comm_log.hpp"
#include "plan/plan.hpp"
#include "src/train/estimate.hpp"
#include "src/train/trainer.hpp"
#include "tests/mpi/mpi_world.hpp"

namespace strata::estimate_check {

// Before each step of a checked run: peaks restart with the step (as
// run_deck's do), and its collectives are logged under its number.
inline void begin_step(core::MemoryTracker& tracker, comm::CommLog* log, int step) {
  tracker.reset_peaks();
  if (log != nullptr) log->set_step(step);
}

// After `step`, the run's last. The layout is the world's, or a single rank
// (a reference run, which every rank makes).
inline void expect_estimate_is_measured(const plan::Plan& c, const core::MemoryTracker& tracker,
                                        const train::Trainer& t, const comm::CommLog* log = nullptr, int step = 0) {
  const bool alone = strategies::layout_of(c).world() == 1;
  const int rank = alone ? 0 : mpi_test::world_rank();
  std::vector<train::CommVolume> want_comm;
  const train::RankMemory want = train::estimate_rank(c, rank, &want_comm);
  const train::RankMemory got = train::rank_memory(tracker, t.host_tracker(), t.nvme_file());
  EXPECT_TRUE(got == want) << "rank " << rank << "\n  measured:  " << train::describe(got)
                           << "\n  estimated: " << train::describe(want);
  if (log == nullptr) return;
  const std::vector<train::CommVolume> got_comm = train::comm_volumes(log->records(), step);
  ASSERT_EQ(got_comm.size(), want_comm.size()) << "rank " << rank << ": (axis, op) kinds of calls";
  for (std::size_t i = 0; i < got_comm.size(); ++i) {
    const auto &g = got_comm[i], &w = want_comm[i];
    EXPECT_EQ(g.axis + " " + g.op, w.axis + " " + w.op) << "rank " << rank;
    EXPECT_EQ(g.group_size, w.group_size) << "rank " << rank << " " << g.axis << " " << g.op;
    EXPECT_EQ(g.calls, w.calls) << "rank " << rank << " " << g.axis << " " << g.op;
    if (g.op != "all_to_allv") {
      EXPECT_EQ(g.bytes, w.bytes) << "rank " << rank << " " << g.axis << " " << g.op;
    }
  }
}

}  // namespace strata::estimate_check
