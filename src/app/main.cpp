// The `strata` command line: parses arguments, reads the deck on rank 0 and
// broadcasts it, and dispatches to the train layer (`run`) or the sweep
// driver (`sweep`, which launches each point as its own MPI job and so runs
// as a plain process, initialising MPI only to write its index). Errors end the job with
// the failing rank's message: status 2 for bad input (every rank finds the
// same error, so all exit cleanly), 1 otherwise (MPI_Abort when other ranks
// could be left waiting).
#include <malloc.h>
#include <mpi.h>

#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <sstream>
#include <limits>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "git_state.hpp"
#include "src/comm/abort.hpp"
#include "src/comm/mpi_check.hpp"
#include "kernels/foundation/error.hpp"
#include "src/deck/deck.hpp"
#include "src/report/claim.hpp"
#include "src/report/h5file.hpp"
#include "src/report/h5read.hpp"
#include "src/sweep/sweep.hpp"
#include "src/train/run.hpp"
#include "src/train/run_control.hpp"
#include "src/sim/calibrate.hpp"
#include "src/train/search.hpp"
#include "src/train/simulate.hpp"
#include "plan/keys.hpp"

namespace {

using strata::core::Error;

// Standard output that a reader going away (`strata run ... | head`) cannot
// end the run through: SIGPIPE is ignored, and stdout becomes a stream whose
// writes to a closed pipe are dropped instead of failing (a failed write
// would make the next print throw). The run goes on and publishes its report.
ssize_t write_or_drop(void*, const char* buf, std::size_t n) {
  static bool gone = false;
  for (std::size_t done = 0; !gone && done < n;) {
    const ssize_t w = ::write(STDOUT_FILENO, buf + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) gone = true;
    else done += std::size_t(w);
  }
  return ssize_t(n);
}

// glibc maps every block above its threshold (128 KiB to 32 MiB) anew and
// unmaps it when freed, and gives the top of its heap back to the kernel past
// another. A step asks for the same blocks again and again: ZeRO's
// reduce-scatter and all-gather buffers, and MPICH's own temporaries in every
// non-blocking collective. Each came back unmapped, so its first touch took a
// page fault per 4 KiB inside the backward pass (an exit to the hypervisor on
// a virtual machine): ZeRO-2 of inputs/llama/validate-sim.toml on two ranks
// ran 27 % slower than plain data parallelism, and 6 % with this. Freed
// memory is kept for the next request instead, as a device's caching
// allocator keeps it: the process holds what its peak needed.
void keep_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

void keep_running_without_a_reader() {
  std::signal(SIGPIPE, SIG_IGN);
  cookie_io_functions_t io = {nullptr, write_or_drop, nullptr, nullptr};
  FILE* out = fopencookie(nullptr, "w", io);
  if (out == nullptr) return;  // the plain stdout then
  std::fflush(stdout);
  setvbuf(out, nullptr, isatty(STDOUT_FILENO) ? _IOLBF : _IOFBF, BUFSIZ);
  stdout = out;
}
using strata::core::ErrorKind;

// Rank 0 reads the deck file; every rank receives its text (or the reason it
// could not be read) so that all ranks parse the same bytes.
std::string read_deck_on_root(const std::string& path, MPI_Comm comm) {
  int rank = 0;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  std::string text, problem;
  if (rank == 0) {
    try {
      text = strata::deck::read_deck_text(path);
    } catch (const Error& e) {
      problem = e.what();
    }
  }
  const std::string payload = strata::comm::broadcast_string(problem.empty() ? "T" + text : "E" + problem, comm);
  if (payload[0] == 'E') strata::core::input_error("{}", payload.substr(1));
  return payload.substr(1);
}

int run_command(const std::string& deck_path, const std::vector<std::string>& sets,
                strata::train::RunOptions opts) {
  const std::string text = read_deck_on_root(deck_path, MPI_COMM_WORLD);
  const strata::deck::Deck deck = strata::deck::parse_deck(deck_path, text, sets);
  return strata::train::run_deck(deck, opts, MPI_COMM_WORLD);
}

void ensure_mpi() {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    MPI_Init(nullptr, nullptr);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
}

int finish(int code) {
  if (strata::report::H5File::files_left_open() > 0) {
    // MPI_Finalize would make HDF5 close a report whose writing failed, which
    // can hang (~H5File); every rank agreed on the error and ends here.
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);
  }
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised) MPI_Finalize();
  return code;
}

struct SweepArgs {
  bool list = false, all = false, index = false, retry_failed = false, valid_points = false;
  int point = -1, world = 0;
  strata::sweep::Selection selection;
  std::string launcher, results = "results";
};

int sweep_command(const std::string& deck_path, const std::vector<std::string>& sets, const SweepArgs& a,
                  const std::string& command_line) {
  if (a.point >= 0 && a.selection.any())
    strata::core::input_error("--point {} runs one point; --where, --points and --limit choose among several", a.point);
  const strata::sweep::Sweep s = strata::sweep::load_sweep(deck_path, sets, a.results, a.selection);
  int valid = 0;
  int chosen = 0;
  for (const auto& p : s.points) valid += p.valid, chosen += p.selected;
  if (valid > 0 && chosen == 0)
    strata::core::input_error("{}: --where, --points and --limit choose none of the {} valid point(s)", deck_path, valid);
  if (a.point >= 0) {
    // One point, in this MPI job (a SLURM array task): `strata run` with the point's overrides.
    if (a.point >= int(s.points.size()))
      strata::core::input_error("--point {}: the sweep has points 0..{}", a.point, s.points.size() - 1);
    const auto& p = s.points[std::size_t(a.point)];
    if (!p.valid) strata::core::input_error("point {} [{}] is not valid: {}", p.index, p.label, p.reason);
    std::vector<std::string> all = sets;
    all.insert(all.end(), p.overrides.begin(), p.overrides.end());
    const std::string text = read_deck_on_root(deck_path, MPI_COMM_WORLD);
    const strata::deck::Deck deck = strata::deck::parse_deck(deck_path, text, all);
    strata::train::RunOptions ro;
    ro.command_line = command_line;
    // run.repeats: the point's runs one after the other in this job. As the
    // driver does, a complete report stands and one that failed is run
    // again (a requeued array task), saying so.
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (const std::string& report : p.reports) {
      std::string status;  // rank 0's reading, every rank's verdict
      if (rank == 0)
        if (const auto h = strata::report::read_headline(report)) status = h->status;
      status = strata::comm::broadcast_string(status, MPI_COMM_WORLD);
      if (status == "complete") {
        if (rank == 0) fmt::print("point {} [{}]: {} is complete already, skipped\n", p.index, p.label, report);
        continue;
      }
      if (!status.empty() && rank == 0)
        fmt::print("point {} [{}]: {} (status {}) is run again\n", p.index, p.label, report, status);
      ro.output = report;
      ro.force = true;
      if (const int rc = strata::train::run_deck(deck, ro, MPI_COMM_WORLD); rc != 0) return rc;
    }
    return 0;
  }
  if (a.valid_points) {
    // Machine-readable, for slurm/submit-sweep: "<point> <ranks>" per valid point.
    for (const auto& p : s.points)
      if (p.selected) fmt::print("{} {}\n", p.index, p.world);
    return valid > 0 ? 0 : 2;
  }
  if (a.list) fmt::print("{}", strata::sweep::describe(s, a.all));
  if (valid == 0)
    strata::core::input_error("{}: no valid point in the sweep{}", deck_path,
                              a.list ? "" : " (strata sweep --list shows why each is skipped)");
  if (a.list) return 0;
  if (a.index) {
    ensure_mpi();
    strata::sweep::write_index(s);
    fmt::print("wrote {}/index.h5\n", s.dir);
    return 0;
  }
  // One driver per sweep directory: a second one would take the first's
  // running points for failed ones. (SLURM array tasks, --point, claim each
  // point's report as any run does.)
  std::string claim, said;
  const std::string lock = s.dir + ".lock";
  if (const std::string why = strata::report::take_claim(s.dir, lock, "sweep directory", &claim, &said); !why.empty())
    strata::core::input_error("{}", why);
  fmt::print("{}", said);
  struct Release {
    const std::string &lock, &claim;
    ~Release() { strata::report::release_claim(lock, claim); }
  } release{lock, claim};
  // A stop (SIGINT, SIGTERM, SIGUSR1) goes to the running point's job; the
  // sweep waits for its interrupted report, writes the index and exits as
  // an interrupted run does.
  strata::train::install_stop_signals();
  const int failed = strata::sweep::run_sweep(
      s, {a.world, a.launcher, a.retry_failed, [] { return strata::train::stop_signal(); }});
  ensure_mpi();
  strata::sweep::write_index(s);
  const int stopped = strata::train::stop_signal();
  fmt::print("sweep '{}': index {}/index.h5{}{}\n", s.name, s.dir,
             failed ? fmt::format("; {} point(s) failed", failed) : "",
             stopped ? fmt::format("; stopped by {}", strata::train::signal_name(stopped)) : "");
  if (stopped) return strata::train::interrupted_exit_code(stopped);
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  keep_running_without_a_reader();
  keep_freed_memory();
  // The sweep driver starts MPI jobs of its own: it must not be one.
  bool driver = argc > 1 && std::string(argv[1]) == "sweep";
  for (int i = 1; i < argc; ++i) driver = driver && std::string(argv[i]).rfind("--point", 0) != 0;
  if (!driver) {
    MPI_Init(&argc, &argv);
    // Errors come back as return codes that STRATA_CHECK_MPI turns into
    // messages, instead of MPI's default abort without context.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  int rank = 0, world = 1;
  if (!driver) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
  }

  std::string command_line;
  for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + std::string(argv[i]);

  CLI::App app{"strata: train transformer models under parallelism strategies and record what each costs"};
  app.set_version_flag("--version", fmt::format("strata {} ({})", STRATA_VERSION, STRATA_GIT_COMMIT));
  app.require_subcommand(1);
  std::string deck_path;
  std::vector<std::string> sets;
  strata::train::RunOptions ro;
  ro.command_line = command_line;
  CLI::App* run = app.add_subcommand("run", "run the training job a deck describes and write its HDF5 report");
  run->add_option("deck", deck_path, "TOML deck (see docs/decks.md)")->required();
  run->add_option("--set", sets, "override a deck key: --set section.key=value (repeatable)");
  run->add_option("--output,-o", ro.output,
                  "report path (default: run.output, else results/<run.name>.h5, or <run.name>-2.h5, ... when taken)");
  run->add_flag("--force", ro.force, "replace a file at the report path named (never replaced otherwise)");
  run->add_flag("--dry-run", ro.dry_run, "validate the deck, print the resolved configuration and memory estimate");
  run->add_option("--checkpoint-every", ro.checkpoint_every, "write a sharded checkpoint after every N steps")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()));
  run->add_option("--checkpoint-dir", ro.checkpoint_dir,
                  "where checkpoints go, one step-NNNNNN directory each (default: checkpoints/<run.name>)");
  run->add_option("--resume", ro.resume,
                  "continue from a checkpoint directory, or the latest complete one in a directory of them");
  strata::train::SimulateOptions so;
  so.command_line = command_line;
  CLI::App* simulate = app.add_subcommand(
      "simulate", "predict a deck's step on a machine description, in one process, at any scale, and write its report");
  simulate->add_option("deck", deck_path, "TOML deck (see docs/decks.md)")->required();
  simulate->add_option("--machine,-m", so.machine, "a machine under inputs/machines/ by name, or a path (docs/machines.md)")
      ->required();
  simulate->add_option("--set", sets, "override a deck key: --set section.key=value (repeatable)");
  simulate->add_option("--output,-o", so.output,
                       "report path (default: results/<run.name>-sim.h5, or -sim-2.h5, ... when taken)");
  simulate->add_flag("--force", so.force, "replace a file at --output (never replaced otherwise)");
  strata::train::SearchOptions po;
  po.command_line = command_line;
  std::string memory_limit;
  CLI::App* plan = app.add_subcommand(
      "plan", "rank the layouts of a deck's model for N devices of a machine by predicted throughput, dropping those "
              "that do not fit");
  plan->add_option("deck", deck_path, "TOML deck: the model, data and optimizer (its layout is replaced)")->required();
  plan->add_option("--machine,-m", po.machine, "a machine under inputs/machines/ by name, or a path")->required();
  plan->add_option("--world,-n", po.world, "devices to plan for")->required();
  plan->add_option("--memory-limit", memory_limit, "bytes per device, e.g. 40GiB (default: the machine's memory)");
  plan->add_option("--top", po.top, "rows to print (default 10)");
  plan->add_option("--jobs,-j", po.jobs, "processes judging layouts at once (default: one per core)");
  plan->add_option("--set", sets, "override a deck key for every candidate (repeatable)");
  plan->add_option("--output,-o", po.output,
                   "report path (default: results/<run.name>-plan.h5, or -plan-2.h5, ... when taken)");
  plan->add_flag("--force", po.force, "replace a file at --output (never replaced otherwise)");
  plan->add_flag("--exhaustive", po.exhaustive,
                 "judge every layout (the whole throughput-memory front), none pruned by its lower bound");
  strata::sim::CalibrateOptions co;
  co.command_line = command_line;
  CLI::App* calibrate = app.add_subcommand(
      "calibrate", "measure this machine (kernels, collectives, storage) and write its machine description");
  calibrate->add_option("--output,-o", co.output, "machine description path (default: results/machine-<host>.toml)");
  calibrate->add_flag("--quick", co.quick, "fewer shapes and sizes, shorter timings");
  // CLI11's PositiveNumber would print its bound, the largest double, in 309 digits.
  calibrate->add_option("--threads", co.threads, "threads per rank (default 1: one rank per core)")
      ->check(CLI::Range(1, 4096));
  SweepArgs sw;
  CLI::App* sweep = app.add_subcommand(
      "sweep", "run every valid point of a deck's [sweep] table, each as its own MPI job, and index the reports");
  sweep->add_option("deck", deck_path, "TOML deck with a [sweep] table (see docs/decks.md)")->required();
  sweep->add_option("--set", sets, "override a deck key for every point (repeatable)");
  sweep->add_flag("--list", sw.list, "print the valid points, one line each, and stop");
  sweep->add_flag("--all", sw.all, "with --list: the skipped points too, with the reason");
  sweep->add_option("--world", sw.world, "ranks available: larger points are not run (default: SLURM_NTASKS, else no limit)");
  sweep->add_option("--launcher", sw.launcher,
                    "command that starts a point on {n} ranks (default: srun --mpi=pmi2 -n {n} under SLURM, else mpiexec -n {n})");
  sweep->add_flag("--retry-failed", sw.retry_failed, "run points that failed before again");
  sweep->add_option("--where", sw.selection.where,
                    "run (or list) only the points meeting this clause, as in [sweep] where (repeatable)");
  sweep->add_option("--points", sw.selection.points, "run (or list) only these points: indices and ranges, 0-5,9");
  sweep->add_option("--limit", sw.selection.limit, "run (or list) only the first N of the points chosen");
  sweep->add_option("--point", sw.point, "run only this point, in this MPI job (what a SLURM array task does)")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()));
  sweep->add_flag("--index", sw.index, "only rewrite results/<sweep>/index.h5 from the reports on disk");
  sweep->add_flag("--valid-points", sw.valid_points, "print '<point> <ranks>' for each valid point (for scripts)");
  sweep->add_option("--results", sw.results, "directory of sweep results (default: results)");

  int status = 0;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "successes"; every real parse error is bad input.
    std::ostringstream quiet;  // only rank 0 speaks
    const int code = rank == 0 ? app.exit(e) : app.exit(e, quiet, quiet);
    return finish(code == 0 ? 0 : 2);
  }

  try {
    if (*run) status = run_command(deck_path, sets, ro);
    if (*calibrate) status = strata::sim::calibrate(co, MPI_COMM_WORLD);
    if (*plan) {
      if (world > 1) strata::core::input_error("strata plan runs in one process: start it without mpiexec or srun");
      if (!memory_limit.empty()) {
        const auto bytes = strata::plan::parse_bytes(memory_limit);
        if (const auto* why = std::get_if<std::string>(&bytes))
          strata::core::input_error("--memory-limit {}: {}", memory_limit, *why);
        po.memory_limit = std::get<std::uint64_t>(bytes);
      }
      status = strata::train::search_layouts(deck_path, read_deck_on_root(deck_path, MPI_COMM_WORLD), sets, po);
    }
    if (*simulate) {
      if (world > 1) strata::core::input_error("strata simulate runs in one process: start it without mpiexec or srun");
      const std::string text = read_deck_on_root(deck_path, MPI_COMM_WORLD);
      status = strata::train::simulate_deck(strata::deck::parse_deck(deck_path, text, sets), so);
    }
    if (*sweep) status = sweep_command(deck_path, sets, sw, command_line);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::input || e.agreed()) {
      if (rank == 0) fmt::print(stderr, "strata: {}: {}\n", e.kind() == ErrorKind::input ? "error" : "failed", e.what());
      // Every rank is here: none leaves before rank 0 has said why (mpiexec
      // ends the job's other processes once one exits with an error).
      if (e.agreed() && world > 1) MPI_Barrier(MPI_COMM_WORLD);
      return finish(e.exit_code());
    }
    if (world > 1) strata::comm::abort_job(MPI_COMM_WORLD, rank, e.what(), e.exit_code());
    fmt::print(stderr, "strata: rank {} failed: {}\n", rank, e.what());
    return finish(e.exit_code());
  } catch (const std::exception& e) {
    if (world > 1) strata::comm::abort_job(MPI_COMM_WORLD, rank, e.what(), 1);
    fmt::print(stderr, "strata: rank {} failed: {}\n", rank, e.what());
    return finish(1);
  }
  return finish(status);
}
