// A run's session: the paths it writes (its report and its checkpoint
// directory), checked and claimed before any work so that two runs never
// write the same ones; the checkpoint it resumes from and the ones it
// writes; its report file; and the failure protocol, how it ends when a
// rank fails (docs/failures.md). Collective over the run's ranks.
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "src/deck/deck.hpp"
#include "src/report/h5file.hpp"
#include "src/train/checkpoint.hpp"
#include "src/train/paths.hpp"
#include "src/train/run_options.hpp"
#include "src/train/run_report.hpp"

namespace strata::train {

class Session {
 public:
  // Checks the paths, finds the checkpoint --resume names (written on
  // `layout`, or re-shardable onto it), installs the stop signals, then
  // claims the paths: bad input is an error on every rank before anything
  // is written.
  Session(const deck::Deck& deck, const RunOptions& options, CheckpointLayout layout, MPI_Comm comm);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // The run's report: opened (under its temporary name) by open_report().
  report::H5File& open_report();
  report::H5File& report() { return *report_; }
  const CheckpointRef& resume() const { return resume_; }
  // Whether a checkpoint is due after `step` completed steps (every
  // --checkpoint-every, or when the run stops early and checkpoints at all).
  bool checkpoint_due(int step, bool stopping) const;
  // Writes the state after `step` completed steps (collective); returns its
  // directory. `global_writer`: this rank also writes the layout-free files.
  std::string checkpoint(int step, strategies::StateStrategy& state, const models::ParamRegistry& reg,
                         bool global_writer, const ScalerState& scaler);
  bool checkpoints() const { return every_ > 0; }
  // A communicator of the session's own for the step boundaries
  // (run_control.hpp): nothing else is issued on it.
  MPI_Comm control() const { return control_; }

  // The records of a run into a report with a status, every rank together
  // (`together` the run's communicator) or one rank alone (MPI_COMM_SELF).
  using WriteRecords = std::function<void(report::H5File& to, const char* status, MPI_Comm together)>;
  // Ends a run that failed on this rank with `failure` (`agreed`: every
  // rank threw it at the same point). When every rank failed, the ranks
  // publish the run's report with status failed and the agreed message,
  // and this throws it, agreed. When some rank is still running (waiting in
  // a collective for this one), this rank writes its own records to a
  // report of its own and ends the job with its message; every rank's rows
  // of the steps before `streamed_until`, already in the run's file, are
  // kept there, the file renamed to <report>.streamed.h5 and named in the
  // report.
  [[noreturn]] void fail(const std::string& failure, bool agreed, int diverged_at, const Provenance& prov,
                         const WriteRecords& write, int streamed_until);

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  std::string report_path_, checkpoint_dir_;
  int every_ = 0;
  int keep_ = 0;  // run.keep_checkpoints
  CheckpointLayout layout_;
  CheckpointRef resume_;
  std::optional<PathClaim> report_claim_, checkpoint_claim_;
  MPI_Comm control_ = MPI_COMM_NULL, failures_ = MPI_COMM_NULL;
  std::unique_ptr<report::H5File> report_;
};

}  // namespace strata::train
