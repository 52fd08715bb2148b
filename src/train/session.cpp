#include "src/train/session.hpp"

#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "kernels/foundation/error.hpp"
#include "src/comm/abort.hpp"
#include "src/comm/mpi_check.hpp"
#include "src/train/run_control.hpp"

namespace strata::train {

namespace {

// How long a failing rank waits for the others to report a failure too
// before it ends the job alone: long enough for ranks that fail at the same
// point at different speeds, short enough that the job ends within seconds.
constexpr double kAgreeSeconds = 5.0;

}  // namespace

Session::Session(const deck::Deck& deck, const RunOptions& options, CheckpointLayout layout, MPI_Comm comm)
    : comm_(comm),
      checkpoint_dir_(options.checkpoint_dir.empty() ? "checkpoints/" + deck.config.run.name : options.checkpoint_dir),
      every_(options.checkpoint_every), keep_(deck.config.run.keep_checkpoints), layout_(std::move(layout)) {
  const plan::Plan& cfg = deck.config;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank_));
  report_path_ = check_output_paths(comm, !options.output.empty() ? options.output : cfg.run.output,
                                    "results/" + cfg.run.name + ".h5", options.force, checkpoint_dir_, checkpoints(),
                                    run_inputs(deck, options.resume));
  if (cfg.parallel.offload == plan::Offload::nvme) check_offload_dir(comm, cfg.offload.path);
  if (!options.resume.empty()) {
    resume_ = find_checkpoint(comm, options.resume, layout_);
    if (resume_.step >= cfg.run.steps)
      core::input_error("--resume {}: the checkpoint is after step {}, and run.steps = {}: nothing left to run "
                        "(raise run.steps to train on)",
                        resume_.dir, resume_.step, cfg.run.steps);
  }
  // From here a stop signal is kept for the first step boundary (a claim
  // must not be left behind by a signal's default action).
  install_stop_signals();
  // Claimed once the input is known good (a refused run writes nothing).
  report_claim_.emplace(comm, report_path_, "report");
  if (checkpoints()) checkpoint_claim_.emplace(comm, checkpoint_dir_, "checkpoint directory");
}

Session::~Session() {
  // Best effort: called while unwinding too.
  if (control_ != MPI_COMM_NULL) MPI_Comm_free(&control_);
  if (failures_ != MPI_COMM_NULL) MPI_Comm_free(&failures_);
}

report::H5File& Session::open_report() {
  report_ = std::make_unique<report::H5File>(comm_, report_path_);
  // Two communicators of the run's own for ending it (run_control.hpp).
  STRATA_CHECK_MPI(MPI_Comm_dup(comm_, &control_));
  STRATA_CHECK_MPI(MPI_Comm_dup(comm_, &failures_));
  return *report_;
}

bool Session::checkpoint_due(int step, bool stopping) const {
  return every_ > 0 && (step % every_ == 0 || stopping);
}

std::string Session::checkpoint(int step, strategies::StateStrategy& state, const models::ParamRegistry& reg,
                                bool global_writer, const ScalerState& scaler) {
  const std::string written = write_checkpoint(comm_, checkpoint_dir_, step, layout_, state, reg, global_writer, scaler);
  if (rank_ == 0) prune_checkpoints(checkpoint_dir_, step, keep_);
  return written;
}

void Session::fail(const std::string& failure, bool agreed, int diverged_at, const Provenance& prov,
                   const WriteRecords& write, int streamed_until) {
  report::H5File& file = *report_;
  // Every rank failed alike (a memory limit they all exceed, a checkpoint
  // they all refuse): they agree on the message and publish the report
  // together. Otherwise the others wait in a collective for this rank:
  // it publishes a report of its own records and ends the job.
  if (!agreed && !every_rank_failed(failures_, kAgreeSeconds)) {
    try {
      // The run's path gets this rank's records, marked as its alone. The
      // shared file holds every rank's rows of the windows written, whole as
      // of its last flush (the others write it only together with this
      // rank): kept under a name of its own; without a window, it goes.
      report::H5File alone(MPI_COMM_SELF, file.final_path(), fmt::format(".rank{}.partial", rank_));
      write_provenance(alone, prov);
      alone.set_attr("/", "error", fmt::format("rank {}: {}", rank_, failure));
      alone.set_attr("/", "failed_rank", std::int64_t(rank_));
      alone.set_attr("/", "rows_of_ranks", std::to_string(rank_));
      const std::string& fin = file.final_path();
      const std::string kept =
          (fin.size() > 3 && fin.ends_with(".h5") ? fin.substr(0, fin.size() - 3) : fin) + ".streamed.h5";
      std::error_code taken;
      const bool keep = streamed_until > 0 && !std::filesystem::exists(kept, taken) &&
                        std::rename(file.temp_path().c_str(), kept.c_str()) == 0;
      if (keep) {
        alone.set_attr("/", "streamed_report", kept);
        alone.set_attr("/", "streamed_until_step", std::int64_t(streamed_until));
      }
      write(alone, "failed", MPI_COMM_SELF);
      alone.publish();
      if (!keep) std::filesystem::remove(file.temp_path());
      std::fprintf(stderr, "strata: rank %d wrote its own records to %s\n", rank_, alone.final_path().c_str());
      if (keep)
        std::fprintf(stderr, "strata: every rank's rows of steps 0-%d are kept in %s\n", streamed_until - 1,
                     kept.c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "strata: rank %d could not write its report: %s\n", rank_, e.what());
    }
    report_claim_->release();
    if (checkpoint_claim_) checkpoint_claim_->release();
    comm::abort_job(comm_, rank_, failure, 1);
  }
  // The report itself failed (agreed): nothing more can be written to it.
  if (file.broken()) throw core::Error(core::ErrorKind::runtime, failure, true);
  // An error the ranks already agreed on (a checkpoint's) is one message.
  const std::string message = agreed ? failure : agreed_message(comm_, failure);
  file.set_attr("/", "error", message);
  if (diverged_at >= 0) file.set_attr("/", "diverged_at_step", std::int64_t(diverged_at));
  write(file, "failed", comm_);
  file.publish();
  // Thrown, agreed, rather than returned: the communicators and the GPU
  // arena are then destroyed while unwinding, which aborts NCCL's
  // communicators instead of waiting for operations a failed step left.
  throw core::Error(core::ErrorKind::runtime, fmt::format("{}\nreport: {} (status failed)", message, file.final_path()),
                    true);
}

}  // namespace strata::train
