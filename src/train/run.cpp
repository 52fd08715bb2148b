// Running a deck, in order: the layout against the world, the device, the
// mesh, the session (paths, claims, resume), the provenance and the peak,
// the report, the trainer, the step loop, and how the run ends (its
// report's status, and the failure protocol when a rank fails).
#include "src/train/run.hpp"

#include <csignal>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kernels/foundation/clock.hpp"
#include "kernels/foundation/error.hpp"
#include "kernels/foundation/memory.hpp"
#include "kernels/kernels.hpp"
#include "models/model.hpp"
#include "src/comm/backend.hpp"
#include "src/comm/mpi_check.hpp"
#include "src/mesh/mesh.hpp"
#include "src/train/checkpoint.hpp"
#include "src/train/console.hpp"
#include "src/train/device.hpp"
#include "src/train/dry_run.hpp"
#include "src/train/peak.hpp"
#include "src/train/records.hpp"
#include "src/train/run_control.hpp"
#include "src/train/run_report.hpp"
#include "src/train/session.hpp"
#include "src/train/steps.hpp"
#include "src/train/trainer.hpp"
#include "strategies/registry.hpp"

namespace strata::train {

namespace {

// Under srun, the step's task count must be the MPI world: srun without a
// PMI plugin (MPICH here needs --mpi=pmi2) starts that many unconnected
// one-rank copies, each of which would train alone.
void check_slurm_world(int world) {
  const char* tasks = std::getenv("SLURM_STEP_NUM_TASKS");
  if (tasks == nullptr || std::atoi(tasks) == world) return;
  core::input_error("SLURM started {} tasks for this job step but MPI sees {} rank(s): launch with srun --mpi=pmi2 "
                    "(without a PMI plugin srun starts unconnected single-rank copies) or set MpiDefault=pmi2",
                    tasks, world);
}

// The layout must use every rank: the product of its dims is the world.
void check_world(const mesh::Layout& l, int world) {
  const int needed = l.world();
  if (needed != world)
    core::input_error("parallel layout {} = {} rank(s), but the job has {} rank(s); launch with mpiexec -n {} or "
                      "change [parallel]",
                      mesh::describe(l), needed, world, needed);
}

// One time base for every rank's records, so that a send and its receive
// compare: on one node the clock is shared and rank 0's origin is every
// rank's; across nodes each takes its own as it leaves a barrier.
double common_origin(MPI_Comm comm, int world) {
  STRATA_CHECK_MPI(MPI_Barrier(comm));
  double t = prof::now_seconds();
  int one_node = comm::node_place(comm).size == world ? 1 : 0;
  STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &one_node, 1, MPI_INT, MPI_MIN, comm));
  if (one_node) STRATA_CHECK_MPI(MPI_Bcast(&t, 1, MPI_DOUBLE, 0, comm));
  return t;
}

}  // namespace

int run_deck(const deck::Deck& deck, const RunOptions& options, MPI_Comm comm) {
  check_record_window(deck.config);
  if (options.dry_run) return dry_run(deck, options, comm);
  const plan::Plan& cfg = deck.config;
  int rank = 0, world = 1;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  STRATA_CHECK_MPI(MPI_Comm_size(comm, &world));
  check_slurm_world(world);
  const mesh::Layout layout = strategies::layout_of(cfg);
  check_world(layout, world);

  if (cfg.backend.threads > 0) kernels::set_num_threads(cfg.backend.threads);
  const int sharing_gpu = select_device(cfg, comm);
  check_host_holds_parameters(cfg, comm);
  prof::Timeline timeline(cfg.run.profile, common_origin(comm, world));
  comm::CommLog log(timeline.origin());
  const comm::Backend backend = comm_backend(cfg);
  mesh::Mesh mesh(comm, layout, log, backend);

  // The paths this run writes: checked and claimed before any work.
  Session session(deck, options, checkpoint_layout(layout, cfg, deck.resolved_toml), comm);
  const CheckpointRef& resume = session.resume();

  Provenance prov = provenance(deck, options.command_line, kernels::backend_name());
  const double started = prof::now_seconds();
  describe_job(prov, comm);
  describe_software(prov, comm::library_versions(backend), kernels::library_versions());
  const Peak peak = resolve_peak(cfg, comm);
  // MFU compares the job's model FLOP/s with the summed peak of its ranks.
  double job_peak = peak.flops_per_s;
  STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &job_peak, 1, MPI_DOUBLE, MPI_SUM, comm));
  prov.peak_flops = job_peak;
  prov.peak_flops_per_device = peak.flops_per_s;
  prov.peak_source = peak.source;

  report::H5File& file = session.open_report();
  write_provenance(file, prov);
  file.set_attr("/", "device", std::string(plan::name_of(cfg.backend.device)));
  file.set_attr("/", "comm_backend", comm::describe_backend(backend));
  if (!resume.dir.empty()) {
    file.set_attr("/", "resumed_from", resume.dir);
    file.set_attr("/", "resumed_at_step", std::int64_t(resume.step));
  }
  const std::string warning = cores_shared_warning(comm, kernels::num_threads());
  if (!warning.empty()) file.set_attr("/", "warnings", warning);

  DeviceArena arena;  // declared before the tracker: freed after it
  core::MemoryTracker tracker(cfg.backend.memory_limit);
  RunRecords records(cfg, mesh, timeline, log, job_peak);
  const Session::WriteRecords write = [&](report::H5File& to, const char* status, MPI_Comm together) {
    records.write(to, status, together, prov, started);
  };
  StepConsole console{cfg.run.steps, world, cfg.backend.precision == core::Precision::fp16, cfg.model.moe_experts > 0,
                      double(cfg.backend.memory_limit)};
  LoopEnd end;
  std::string failure;
  bool agreed = false;  // every rank threw the same error at the same point
  try {
    if (!kernels::host_memory()) {
      // Inside: a GPU without room on one rank is a failure like any other.
      timeline.set_fence(kernels::synchronize);
      arena.open(cfg.backend.memory_limit, tracker, sharing_gpu, comm);
      file.set_attr("/", "device_arena_bytes", std::int64_t(arena.capacity));
      file.set_attr("/", "device_memory_total", std::int64_t(kernels::device_memory().total));
      if (console.device_bytes == 0) console.device_bytes = double(kernels::device_memory().total);
    }
    Trainer trainer(cfg, tracker, &timeline, job_peak, strategies::parallelize(cfg, &mesh));
    records.prepare(trainer);
    if (const models::NvmeFile* f = trainer.nvme_file()) {
      prov.offload_io = f->mode();
      file.set_attr("/", "offload_io", prov.offload_io);
      if (rank == 0)
        fmt::print("NVMe offload: {} ({:.2f} MiB on rank 0, {})\n", f->path(), double(f->size()) / (1 << 20), f->mode());
    }
    prov.padding_elements = trainer.strategy().padding_elements();
    file.set_attr("/", "data", trainer.data().describe());
    if (rank == 0) {
      fmt::print("strata {} | {} | {} rank(s): {} | {} | {} | {} thread(s) | {:.3f} M parameters | data: {}\n",
                 STRATA_VERSION, prov.backend, world, prov.layout, prov.strategy, prov.precision, prov.threads,
                 double(prov.parameters) / 1e6, trainer.data().describe());
      fmt::print("peak {:.1f} GFLOP/s per rank ({}) | global batch {} = dp {} x {} x micro-batch {} | seq {}\n",
                 job_peak / world / 1e9, peak.source, cfg.data.global_batch, cfg.parallel.dp, trainer.micro_batches(),
                 cfg.data.micro_batch, cfg.model.seq_len);
      if (!warning.empty()) fmt::print("warning: {}\n", warning);
      console.header();
    }
    if (!resume.dir.empty()) {
      load_checkpoint(comm, resume, trainer.strategy(), trainer.registry());
      // The skipped steps carry over (AdamW's step count); the scale only
      // within one precision (an fp32 run's is 1).
      ScalerState sc = resume.scaler;
      if (!resume.same_precision) sc.scale = trainer.scaler().scale, sc.good_steps = 0;
      trainer.set_scaler(sc);
      if (rank == 0)
        fmt::print("resumed from {} (after step {}{})\n", resume.dir, resume.step,
                   resume.reshard ? ", re-sharded from " + resume.saved_layout : "");
    }
    StepLoop{cfg, trainer, tracker, log, records, session, console, rank, mesh::first_copy(layout, rank), job_peak}.run(
        resume.step, end);
  } catch (const core::Error& e) {
    failure = e.what();
    agreed = e.agreed();
  } catch (const std::exception& e) {
    failure = e.what();
    if (failure.empty()) failure = "an error without a message";
  }
  if (!failure.empty()) session.fail(failure, agreed, end.diverged_at, prov, write, records.streamed_until());

  using Outcome = LoopEnd::Outcome;
  const char* status = end.outcome == Outcome::diverged      ? "diverged"
                       : end.outcome == Outcome::interrupted ? "interrupted"
                                                             : "complete";
  if (end.diverged_at >= 0) file.set_attr("/", "diverged_at_step", std::int64_t(end.diverged_at));
  if (end.outcome == Outcome::interrupted) file.set_attr("/", "interrupted_by", std::string(signal_name(end.stopped_by)));
  write(file, status, comm);
  // STRATA_INJECT_REPORT_KILL=RANK: that rank is killed with everything
  // written but not published (the fault tests: nothing poses as complete,
  // and the next run on the path takes over the stale claim).
  if (const char* v = std::getenv("STRATA_INJECT_REPORT_KILL"); v != nullptr && std::atoi(v) == rank)
    std::raise(SIGKILL);
  file.publish();

  print_run_end(comm, records, cfg, file.final_path(), prof::now_seconds() - started);
  if (end.outcome == Outcome::diverged) return 3;
  if (end.outcome == Outcome::interrupted) return interrupted_exit_code(end.stopped_by);
  return 0;
}

}  // namespace strata::train
