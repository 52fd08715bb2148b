// What a run prints as it goes (rank 0): the per-step line, warnings where a
// figure is not what it seems, and the per-rank tables at the end, which
// above 8 ranks become min / median / max with the worst rank named.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "src/train/records.hpp"
#include "src/train/run_report.hpp"
#include "src/train/trainer.hpp"

namespace strata::train {

// One line per run.log_every steps, as the field's training logs have it:
// the steps done of the total (1-based: the last line reads N/N), the mean
// loss over the steps since the last line, the lr and gradient norm of the
// last, the mean step time and the tokens/s and MFU it gives (warm-up steps
// left out unless the interval has only those), the most device memory a
// rank held in those steps (GiB, and the share of device_bytes when known),
// elapsed and ETA; the loss scale under fp16; the auxiliary loss, load
// imbalance and drop rate for MoE (the last step's).
struct StepConsole {
  int total_steps = 1, world = 1;
  bool fp16 = false, moe = false;
  double device_bytes = 0;  // a device's memory (backend.memory_limit, or the GPU's); 0: unknown
  double started = 0;  // prof::now_seconds() when the first step of this run began
  int first_step = 0;  // of this run (a resumed run starts past 0)
  void header() const;
  // Every step, in order: `device_peak` the most bytes a rank held in it.
  void add(const StepRecord& r, double device_peak);
  // The line of the steps added since the last, `r` the last of them.
  void line(const StepRecord& r);

  // The steps added since the last line.
  struct Interval {
    int steps = 0, measured = 0;
    double loss = 0, time = 0, measured_time = 0, peak = 0;
  } interval = {};
};

// Collective: a warning when on some node more threads than cores run
// (ranks x threads per rank); "" when none. Time-sharing makes step times,
// bubbles and bandwidths the machine's scheduling, not the hardware's.
std::string cores_shared_warning(MPI_Comm comm, int threads);

// Collective; rank 0 prints every rank's bytes per category at the end of
// the last step and peak during a step (above 8 ranks: min / median / max),
// from each rank's `device` figures.
void print_memory_per_rank(MPI_Comm comm, const RunningSummary& device);
// Collective; rank 0 prints every rank's measured bubble beside the theory.
void print_bubbles(MPI_Comm comm, const Bubble& b, const std::string& formula);
// Collective, at a run's end: every rank's memory and (a profiled pipeline)
// bubble, then on rank 0 the summary line, the communication per axis and
// op, and where the report is.
void print_run_end(MPI_Comm comm, const RunRecords& r, const plan::Plan& cfg, const std::string& report,
                   double wall_seconds);

}  // namespace strata::train
