// One rank's records of a run and how they become its report: every
// per-rank table (/ranks, /steps, /experts, /memory, /timeline, /comm), the
// communication and pipeline summaries and the headline figures
// (src/train/run_report.hpp's writers).
//
// A rank keeps the records of a window of steps (run.flush_every, or as many
// as fit in kRecordWindowBytes), then appends them to the report's tables,
// folds them into the running figures and drops them. What it keeps for the
// whole run is the summary's and the bubble's medians' samples, 32 B a step,
// and the communication aggregates, one row per axis, op, group and size
// class: its memory does not grow with run.steps.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

#include "kernels/foundation/memory.hpp"
#include "kernels/foundation/timeline.hpp"
#include "plan/plan.hpp"
#include "src/comm/comm_log.hpp"
#include "src/mesh/mesh.hpp"
#include "src/report/h5file.hpp"
#include "src/train/run_report.hpp"
#include "src/train/trainer.hpp"

namespace strata::train {

// The host memory a window of records may take per rank when
// run.flush_every is 0.
inline constexpr double kRecordWindowBytes = 64.0 * (1 << 20);

// How many steps of records a rank keeps before it writes them, and what
// they take: at most `comm` calls and `spans` timeline spans a step (a unit
// has at most a gather, a prefetch and a reduce-scatter per micro-batch;
// per step, buckets and a few scalars), `bytes` for the window in all.
struct RecordWindow {
  int steps = 1;
  std::size_t comm = 0, spans = 0;
  double bytes_per_step = 0, bytes = 0;
};
// The window of a rank of `cfg` whose model has `units` units (ZeRO's unit of
// gathering) and that runs `micro_batches` micro-batches a step.
RecordWindow record_window(const plan::Plan& cfg, std::size_t units, int micro_batches);

// The most host memory a window that run.flush_every asks for may take per
// rank: past it a long run would reserve its whole record at start-up.
inline constexpr double kMaxRecordWindowBytes = double(1 << 30);
// Input error when run.flush_every's window could exceed
// kMaxRecordWindowBytes on a rank holding every layer (the most units a rank
// has: the layers, the embedding and the head), naming the largest
// flush_every that fits. Before any work: run and its dry run.
void check_record_window(const plan::Plan& cfg);

class RunRecords {
 public:
  // The records of this rank of a run of `cfg` on `mesh`, whose spans go to
  // `timeline` and calls to `log`; MFU against `job_peak` FLOP/s.
  RunRecords(const plan::Plan& cfg, const mesh::Mesh& mesh, prof::Timeline& timeline, comm::CommLog& log,
             double job_peak);

  // Before the first step, once the trainer is built: room for a window of
  // calls and spans, its pages touched now (a growing log would pay page
  // faults inside the measured calls).
  void prepare(const Trainer& trainer);
  const RecordWindow& window() const { return window_; }
  // The steps before this one are in the run's report file, every rank's
  // rows, as of its last flush (0: no window written yet).
  int streamed_until() const { return flushed_to_ != nullptr ? next_step_ : 0; }

  // Keeps a step's record with its exposed communication per axis (the
  // log's records from `first_call` on), the routing the trainer recorded
  // and the memory the tracker held.
  StepRecord& keep(StepRecord r, const Trainer& trainer, const core::MemoryTracker& tracker, std::size_t first_call);

  // Whether the window is full: every rank has kept the same steps, so all
  // agree without a word.
  bool window_full() const { return int(steps_.size()) >= window_.steps; }
  // Collective over the run's ranks, at a step boundary: the window's rows
  // appended to `to`'s tables and folded into the running figures, then
  // dropped.
  void flush(report::H5File& to) { flush(to, true); }

  // Everything into `to` with `status`: the run's report, every rank
  // together (`together` the run's communicator), or one failing rank's own
  // (MPI_COMM_SELF), which holds the rows of its last window only (the
  // attribute rows_from_step says from which step). The transfers of
  // collectives are refined across their groups only when every rank
  // completed them (not a failed run's).
  void write(report::H5File& to, const char* status, MPI_Comm together, const Provenance& prov, double started);

  // The headline figures, computed by write() from the records.
  Summary summary;
  std::vector<CommAggregate> comm;
  Bubble bubble;
  // The device's bytes per category at the end of the last step and at
  // their peak over the run (the console's memory table).
  const RunningSummary& running() const { return running_; }
  // The device's most bytes at once in the last step kept.
  std::uint64_t last_device_peak() const { return last_device_peak_; }
  // The most bytes the records held at once, so far.
  std::size_t most_held() const { return most_held_; }

 private:
  void flush(report::H5File& to, bool all_completed);
  std::size_t held() const;

  const plan::Plan& cfg_;
  const mesh::Mesh& mesh_;
  prof::Timeline& timeline_;
  comm::CommLog& log_;
  double job_peak_;
  std::vector<std::string> axes_;
  std::string host_;
  RecordWindow window_;
  // The window: the steps kept since the last flush.
  std::vector<StepRecord> steps_;
  std::vector<ExpertRecord> experts_;  // MoE routing
  std::vector<MemoryRecord> memory_;
  // The whole run's.
  RunningSummary running_;
  BubbleSamples bubble_samples_;
  std::vector<CommAggregate> comm_;  // over the measured steps; group times taken at the end
  const report::H5File* flushed_to_ = nullptr;  // where earlier windows went
  int next_step_ = 0;  // the first step after the windows written
  std::size_t most_held_ = 0;
  std::uint64_t last_device_peak_ = 0;
};

}  // namespace strata::train
