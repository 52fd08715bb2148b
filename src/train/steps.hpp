// The step loop of a run: from its first step (a resumed run's checkpoint's)
// to run.steps, every step's records kept; at each step boundary what every
// rank agrees on (a stop signal, divergence, the slowest rank's time:
// run_control.hpp), the console's line and the checkpoint that is due. A
// failure throws: the session ends the run (session.hpp).
#pragma once

#include "kernels/foundation/memory.hpp"
#include "plan/plan.hpp"
#include "src/comm/comm_log.hpp"
#include "src/train/console.hpp"
#include "src/train/records.hpp"
#include "src/train/session.hpp"
#include "src/train/trainer.hpp"

namespace strata::train {

// How the loop ended; kept where a failure thrown from it leaves it.
struct LoopEnd {
  enum class Outcome { complete, diverged, interrupted } outcome = Outcome::complete;
  int stopped_by = 0;    // the signal that stopped it
  int diverged_at = -1;  // the first step whose loss or gradient norm was not finite
};

struct StepLoop {
  const plan::Plan& cfg;
  Trainer& trainer;
  core::MemoryTracker& tracker;
  comm::CommLog& log;
  RunRecords& records;
  Session& session;
  StepConsole& console;
  int rank;
  bool global_writer;  // this rank writes the checkpoints' layout-free files
  double job_peak;
  // Steps [first, run.steps); `end` says how it ended.
  void run(int first, LoopEnd& end);
};

}  // namespace strata::train
