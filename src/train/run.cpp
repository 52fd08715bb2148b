#include "src/train/run.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <cstdlib>
#include <ctime>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>

#include "kernels/kernels.hpp"
#include "models/model.hpp"
#include "src/comm/abort.hpp"
#include "kernels/foundation/clock.hpp"
#include "src/comm/backend.hpp"
#include "src/comm/mpi_check.hpp"
#include "kernels/foundation/error.hpp"
#include "kernels/foundation/memory.hpp"
#include "src/mesh/mesh.hpp"
#include "src/train/peak.hpp"
#include "src/train/checkpoint.hpp"
#include "src/train/console.hpp"
#include "src/train/estimate.hpp"
#include "src/train/paths.hpp"
#include "src/train/run_control.hpp"
#include "src/train/run_report.hpp"
#include "src/train/trainer.hpp"
#include "strategies/registry.hpp"

namespace strata::train {

namespace {

// Every rank's processor name, unique, in rank order.
std::string gather_hosts(MPI_Comm comm) {
  int size = 1;
  STRATA_CHECK_MPI(MPI_Comm_size(comm, &size));
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  STRATA_CHECK_MPI(MPI_Get_processor_name(name, &len));
  std::vector<char> all(std::size_t(size) * MPI_MAX_PROCESSOR_NAME);
  STRATA_CHECK_MPI(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME,
                                 MPI_CHAR, comm));
  std::string out;
  std::set<std::string> seen;
  for (int r = 0; r < size; ++r) {
    std::string h(&all[std::size_t(r) * MPI_MAX_PROCESSOR_NAME]);
    if (seen.insert(h).second) out += (out.empty() ? "" : ",") + h;
  }
  return out;
}

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

// The dry run's estimate, printed: per class of ranks with identical
// figures, each pool's bytes per category held at the end of a step and at
// its peak, and the collectives a rank of the class issues per step.
void print_estimate(const deck::Deck& deck, const Estimate& e, std::int64_t params) {
  fmt::print("# resolved configuration ({})\n{}\n", deck.path, deck.resolved_toml);
  fmt::print("parameters: {} ({:.3f} M)\n", params, double(params) / 1e6);
  constexpr int K = core::kNumMemCategories;
  fmt::print("memory estimate, {} rank(s) in {} class(es) of identical figures (a step run on the meta device; "
             "held at its end, and peak during it):\n",
             e.world, e.classes.size());
  fmt::print("  {:<16} {:<6} {:<4}", "ranks", "pool", "");
  for (int c = 0; c < K; ++c) fmt::print(" {:>11}", core::category_name(core::MemCategory(c)));
  fmt::print(" {:>11}\n", "total");
  for (const RankClass& k : e.classes) {
    const std::string who = rank_ranges(k.ranks);
    for (int p = 0; p < core::kNumPools; ++p) {
      const auto pool = core::Pool(p);
      if (!uses_pool(deck.config, pool)) continue;
      const PoolFigures& f = k.memory[pool];
      fmt::print("  {:<16} {:<6} {:<4}", p == 0 ? who : "", core::pool_name(pool), "held");
      for (int c = 0; c < K; ++c) fmt::print(" {:>11}", core::format_bytes(double(f.held[std::size_t(c)])));
      fmt::print(" {:>11}\n  {:<16} {:<6} {:<4}", core::format_bytes(double(f.total_held())), "", "", "peak");
      for (int c = 0; c < K; ++c) fmt::print(" {:>11}", core::format_bytes(double(f.peak[std::size_t(c)])));
      fmt::print(" {:>11}\n", core::format_bytes(double(f.total_peak)));
    }
  }
  fmt::print("communication per step (a rank of each class):\n");
  for (const RankClass& k : e.classes) {
    fmt::print("  ranks {}:{}\n", rank_ranges(k.ranks), k.comm.empty() ? " none" : "");
    for (const CommVolume& v : k.comm)
      fmt::print("    {:<6} {:<15} n {:>4} {:>6} call(s) {:>12}\n", v.axis, v.op, v.group_size, v.calls,
                 core::format_bytes(double(v.bytes)));
  }
  fmt::print("compute per step (a rank of each class; its kernels counted on the meta device):\n");
  fmt::print("  {:<16} {:<16} {:>14} {:>14} {:>12} {:>8}\n", "ranks", "phase", "matmul GFLOP", "other GFLOP",
             "moved GB", "kernels");
  for (const RankClass& k : e.classes) {
    std::map<std::string, kernels::WorkCost> phases;
    for (const auto& w : k.compute) {
      auto& p = phases[w.phase];
      p.matmul_flops += w.matmul_flops, p.other_flops += w.other_flops, p.bytes += w.bytes, p.kernels += w.kernels;
    }
    bool first_line = true;
    for (const auto& [phase, p] : phases) {
      fmt::print("  {:<16} {:<16} {:>14.3f} {:>14.3f} {:>12.3f} {:>8}\n", first_line ? rank_ranges(k.ranks) : "",
                 phase, p.matmul_flops / 1e9, p.other_flops / 1e9, p.bytes / 1e9, p.kernels);
      first_line = false;
    }
  }
  const auto& b = deck.config.backend;
  if (b.memory_limit != 0 || b.host_memory_limit != 0) {
    if (e.does_not_fit.empty())
      fmt::print("fits: every rank's peak is within backend.memory_limit{}\n",
                 b.host_memory_limit != 0 ? " and backend.host_memory_limit" : "");
    for (const auto& line : e.does_not_fit) fmt::print("DOES NOT FIT: {}\n", line);
  }
}

// STRATA_INJECT_FAILURE="RANK:STEP" makes that rank fail at the start of that
// step: how the tests (and a user checking a cluster's launcher) see that one
// failing rank ends the whole job with its message instead of a hang.
struct InjectedFailure {
  int rank = -1, step = -1;
};
InjectedFailure injected_failure() {
  InjectedFailure f;
  if (const char* v = std::getenv("STRATA_INJECT_FAILURE")) {
    if (std::sscanf(v, "%d:%d", &f.rank, &f.step) != 2)
      core::input_error("STRATA_INJECT_FAILURE={}: expected RANK:STEP, e.g. 1:3", v);
  }
  return f;
}

}  // namespace

// On the CPU without backend.memory_limit, the ranks of a node share its
// memory: when their fp32 parameters alone exceed it, the run is refused
// before anything is allocated (instead of a std::bad_alloc or the kernel's
// OOM killer later). Agreed: nodes may differ.
void check_host_holds_parameters(const plan::Plan& cfg, MPI_Comm comm) {
  double need = 0, have = 0;
  const int on_node = comm::node_place(comm).size;  // collective: every rank calls it
  if (cfg.backend.device == kernels::Device::cpu && cfg.backend.memory_limit == 0 && !cfg.offload.params) {
    const auto& p = cfg.parallel;
    // A lower bound: the experts' share is smaller still (1/ep).
    const double share =
        double(p.tp) * p.pp * (p.zero >= 3 ? p.dp * p.cp : 1) * (cfg.model.moe_experts > 0 ? p.ep : 1);
    need = 4.0 * double(models::family(cfg).parameters(cfg)) / share * on_node;
    have = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  }
  double worst[2] = {need > have ? need : 0.0, need > have ? have : 0.0};
  STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, worst, 2, MPI_DOUBLE, MPI_MAX, comm));
  if (worst[0] > 0)
    core::input_error("does not fit: the fp32 parameters of the ranks of a node alone need {}, and the node has {} "
                      "of memory (use more ranks or nodes, a smaller model, or set backend.memory_limit to try anyway)",
                      core::format_bytes(worst[0]), core::format_bytes(worst[1]));
}

// backend.device = "cuda": rank r of a node takes GPU r mod the node's GPU
// count (ranks share a GPU only when there are more of them than GPUs).
// "kokkos": the same over the devices of Kokkos' default execution space
// (one, the host, for a host-side Kokkos). Returns how many ranks share this
// rank's device (1 on the CPU).
int select_device(const plan::Plan& cfg, MPI_Comm comm) {
  const kernels::Device device = cfg.backend.device;
  if (device == kernels::Device::cpu) return 1;
  const char* name = kernels::device_name(device);
  if (device == kernels::Device::cuda && !kernels::cuda_built())
    core::input_error("backend.device = \"cuda\": this build has the CPU backend only; build with the CUDA backend "
                      "(cmake --preset cuda, or STRATA_WITH_CUDA=AUTO where nvcc is found)");
  if (device == kernels::Device::kokkos && !kernels::kokkos_built())
    core::input_error("backend.device = \"kokkos\": this build has no Kokkos backend (it has {}); build with "
                      "STRATA_WITH_KOKKOS=ON or AUTO where find_package(Kokkos) finds one (-DKokkos_ROOT=...)",
                      kernels::built_devices());
  const auto [local, on_node] = comm::node_place(comm);
  const int devices = kernels::device_count(device);
  if (devices == 0)
    core::runtime_error("backend.device = \"{}\" but this node has no usable {} ({})", name,
                        device == kernels::Device::cuda ? "GPU" : "device", kernels::describe_devices(device));
  // NCCL refuses two ranks of one communicator on one GPU: say so before it does.
  if (device == kernels::Device::cuda && on_node > devices && cfg.backend.comm != plan::CommChoice::mpi)
    core::runtime_error("{} ranks on this node but {} GPU(s): NCCL cannot share a GPU between ranks; start at most "
                        "{} rank(s) per node, or set backend.comm = \"mpi\" (device buffers staged through the host)",
                        on_node, devices, devices);
  kernels::use_device(device, local % devices);
  // Device buffers other than a GPU's move through MPI only when the host can
  // read them: staging is the CUDA communicators' (cudaMemcpy). Every rank
  // runs the same build, so every rank decides alike.
  int world = 1;
  STRATA_CHECK_MPI(MPI_Comm_size(comm, &world));
  if (device == kernels::Device::kokkos && !kernels::host_memory() && world > 1)
    core::runtime_error("backend.device = \"kokkos\" on {} ranks: this Kokkos' memory space ({}) is not host "
                        "memory, and MPI is handed host memory only; run one rank, or use a host-side Kokkos "
                        "(Serial, OpenMP) or backend.device = \"cuda\"",
                        world, kernels::backend_name());
  kernels::set_gemm_precision(cfg.backend.precision);
  return on_node / devices + (local % devices < on_node % devices ? 1 : 0);
}

// The device arena: one region of the GPU for every tracked buffer, sized
// backend.memory_limit, or, without a limit, the free memory less a reserve
// for what the tracker does not hold (the CUDA context's own allocations,
// cuBLAS workspaces, NCCL's buffers), divided among the ranks that share the
// GPU (every rank reads the free memory before any allocates). Freed after
// the tracker that uses it.
struct DeviceArena {
  void* base = nullptr;
  std::size_t capacity = 0;
  DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena() {
    if (base != nullptr) kernels::device_free(base);
  }
  void open(std::size_t limit, core::MemoryTracker& tracker, int sharing, MPI_Comm comm) {
    STRATA_CHECK_MPI(MPI_Barrier(comm));
    const kernels::DeviceMemory m = kernels::device_memory();
    STRATA_CHECK_MPI(MPI_Barrier(comm));
    if (m.total == 0 && limit == 0)
      core::runtime_error("{} does not report its device's memory: set backend.memory_limit (the bytes each rank's "
                          "arena takes)",
                          kernels::backend_name());
    const std::size_t reserve = std::max<std::size_t>(std::size_t(2) << 30, m.total / 20);
    const std::size_t room = (m.free > reserve ? m.free - reserve : 0) / std::size_t(sharing);
    if (limit > room)
      core::runtime_error("backend.memory_limit = {} does not fit on the GPU: {} free of {}, {} kept for the CUDA "
                          "context, cuBLAS and NCCL, the rest shared by {} rank(s)",
                          core::format_bytes(double(limit)), core::format_bytes(double(m.free)),
                          core::format_bytes(double(m.total)), core::format_bytes(double(reserve)), sharing);
    capacity = (limit > 0 ? limit : room) / 256 * 256;
    base = kernels::device_alloc(capacity);
    tracker.use_arena(base, capacity, kernels::zero_bytes);
  }
};

namespace {

// A duplicate of a communicator, freed at the end of its scope.
struct DupComm {
  MPI_Comm comm = MPI_COMM_NULL;
  explicit DupComm(MPI_Comm of) { STRATA_CHECK_MPI(MPI_Comm_dup(of, &comm)); }
  DupComm(const DupComm&) = delete;
  DupComm& operator=(const DupComm&) = delete;
  ~DupComm() { MPI_Comm_free(&comm); }
};

// How long a failing rank waits for the others to report a failure too
// before it ends the job alone: long enough for ranks that fail at the same
// point at different speeds, short enough that the job ends within seconds.
constexpr double kAgreeSeconds = 5.0;

}  // namespace

std::string iso_time_utc() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string report_path(const deck::Deck& deck, const RunOptions& options) {
  if (!options.output.empty()) return options.output;
  if (!deck.config.run.output.empty()) return deck.config.run.output;
  return "results/" + deck.config.run.name + ".h5";
}

namespace {

// The estimate as a report: the provenance of a run, status "estimate", the
// /memory table a run writes, one row per rank, pool and category of the
// estimated step (numbered 0), and /compute per rank class, layer and phase.
void write_estimate_report(const deck::Deck& deck, const RunOptions& options, const Estimate& e, std::int64_t params) {
  report::H5File file(MPI_COMM_SELF, options.output);
  Provenance prov;
  prov.command_line = options.command_line;
  prov.start_time = iso_time_utc();
  prov.hosts = std::string(1, '-');  // no hosts: nothing ran (a literal here trips GCC 12's -Wrestrict)
  prov.world_size = e.world;
  prov.deck_path = deck.path;
  prov.deck_text = deck.text;
  prov.resolved_config = deck.resolved_toml;
  prov.backend = "meta";
  prov.threads = kernels::num_threads();
  prov.parameters = params;
  write_provenance(file, prov);
  file.set_attr("/", "device", std::string(plan::name_of(deck.config.backend.device)));
  std::vector<MemoryRecord> rows;
  for (const RankClass& k : e.classes)
    for (int r : k.ranks)
      for (const auto& m : memory_records(r, 0, k.memory, deck.config)) rows.push_back(m);
  std::sort(rows.begin(), rows.end(), [](const MemoryRecord& a, const MemoryRecord& b) { return a.rank < b.rank; });
  write_memory_table(file, rows);
  report::Table compute("compute", "one step's kernels per rank class, layer and phase, counted on the meta device");
  compute.col_i64("rank", "1", "the first rank of the class (every rank of it does the same work)")
      .col_str("ranks", 64, "", "the ranks of the class, as ranges: 0-3,8")
      .col_i64("layer", "1", "0 embedding, 1..L transformer blocks, L+1 final norm, head and loss, -1 whole-model work")
      .col_str("phase", 16, "", "forward, backward, backward_input, backward_weight, recompute or optimizer")
      .col_f64("matmul_flops", "FLOP", "matrix products: GEMMs and attention's two products (full T x T square)")
      .col_f64("other_flops", "FLOP", "every other operation's arithmetic")
      .col_f64("bytes", "B", "bytes the kernels read and write, each once")
      .col_i64("kernels", "1", "kernels launched");
  for (const RankClass& k : e.classes)
    for (const auto& w : k.compute)
      compute.add_row({std::int64_t(k.ranks.front()), rank_ranges(k.ranks).substr(0, 63), std::int64_t(w.layer),
                       w.phase, w.matmul_flops, w.other_flops, w.bytes, std::int64_t(w.kernels)});
  file.write_table(compute);
  file.set_attr("/", "status", "estimate");
  file.publish();
}

// --dry-run: the estimate of every rank of the layout, computed by rank 0 of
// whatever launched it (one process is enough, at any scale); the others
// take its verdict, so that an error ends every rank alike. Exit status 3
// when a rank's peak exceeds a memory limit.
int dry_run(const deck::Deck& deck, const RunOptions& options, MPI_Comm comm) {
  const plan::Plan& cfg = deck.config;
  int rank = 0;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  // status, error kind (0 none, 1 input, 2 runtime), and the message.
  int verdict[2] = {0, 0};
  std::string message;
  if (rank == 0) {
    try {
      if (!options.output.empty())
        check_output_paths(MPI_COMM_SELF, options.output, "", false, deck.path,
                           cfg.data.source == plan::DataSource::text ? cfg.data.path : "");
      if (cfg.backend.threads > 0) kernels::set_num_threads(cfg.backend.threads);
      const std::int64_t params = models::parameter_count(cfg);
      const Estimate e = estimate(cfg);
      print_estimate(deck, e, params);
      const mesh::Layout layout = strategies::layout_of(cfg);
      if (layout.world() <= 64)
        fmt::print("process mesh ({}):\n{}", mesh::describe(layout), mesh::layout_table(layout));
      if (!options.output.empty()) {
        write_estimate_report(deck, options, e, params);
        fmt::print("estimate report: {}\n", options.output);
      }
      verdict[0] = e.does_not_fit.empty() ? 0 : 3;
    } catch (const core::Error& err) {
      verdict[1] = err.kind() == core::ErrorKind::input ? 1 : 2;
      message = err.what();
    } catch (const std::exception& err) {
      verdict[1] = 2;
      message = err.what();
    }
    std::fflush(stdout);
  }
  STRATA_CHECK_MPI(MPI_Bcast(verdict, 2, MPI_INT, 0, comm));
  if (verdict[1] != 0)
    throw core::Error(verdict[1] == 1 ? core::ErrorKind::input : core::ErrorKind::runtime,
                      comm::broadcast_string(message, comm));
  return verdict[0];
}

}  // namespace

int run_deck(const deck::Deck& deck, const RunOptions& options, MPI_Comm comm) {
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
  const std::int64_t params = models::parameter_count(cfg);

  // One time base for every rank's records, so that a send and its receive
  // compare: on one node the clock is shared and rank 0's origin is every
  // rank's; across nodes each takes its own as it leaves a barrier.
  const double origin = [&] {
    STRATA_CHECK_MPI(MPI_Barrier(comm));
    double t = prof::now_seconds();
    int one_node = comm::node_place(comm).size == world ? 1 : 0;
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &one_node, 1, MPI_INT, MPI_MIN, comm));
    if (one_node) STRATA_CHECK_MPI(MPI_Bcast(&t, 1, MPI_DOUBLE, 0, comm));
    return t;
  }();
  prof::Timeline timeline(cfg.run.profile, origin);
  comm::CommLog log(timeline.origin());
  // backend.comm: NCCL on the GPU unless told otherwise; MPI with device
  // buffers stages them through host memory (Debian's MPICH is not
  // CUDA-aware).
  const bool gpu = !kernels::host_memory();
  const comm::Backend comm_backend = !gpu                              ? comm::Backend::mpi
                                     : cfg.backend.comm == plan::CommChoice::mpi ? comm::Backend::mpi_staged
                                                                       : comm::Backend::nccl;
  mesh::Mesh mesh(comm, layout, log, comm_backend);
  const std::vector<std::string> axes = layout.axis_names();

  // The paths this run writes: checked and claimed before any work.
  const std::string out_path = report_path(deck, options);
  const std::string checkpoint_dir =
      options.checkpoint_dir.empty() ? "checkpoints/" + cfg.run.name : options.checkpoint_dir;
  const bool checkpoints = options.checkpoint_every > 0;
  check_output_paths(comm, out_path, checkpoint_dir, checkpoints, deck.path,
                     cfg.data.source == plan::DataSource::text ? cfg.data.path : "");

  const int stages = layout.size("pp");
  const int chunks = stages > 1 ? cfg.parallel.virtual_stages : 1;  // model chunks per pipeline rank
  const CheckpointLayout ck_layout = checkpoint_layout(layout, cfg, deck.resolved_toml);
  CheckpointRef resume;
  if (!options.resume.empty()) {
    resume = find_checkpoint(comm, options.resume, ck_layout);
    if (resume.step >= cfg.run.steps)
      core::input_error("--resume {}: the checkpoint is after step {}, and run.steps = {}: nothing left to run "
                        "(raise run.steps to train on)",
                        resume.dir, resume.step, cfg.run.steps);
  }
  // From here a stop signal is kept for the first step boundary (a claim
  // must not be left behind by a signal's default action).
  install_stop_signals();
  // Claimed once the input is known good (a refused run writes nothing).
  PathClaim report_claim(comm, out_path, "report");
  std::optional<PathClaim> checkpoint_claim;
  if (checkpoints) checkpoint_claim.emplace(comm, checkpoint_dir, "checkpoint directory");

  Provenance prov;
  prov.command_line = options.command_line;
  prov.start_time = iso_time_utc();
  const double started = prof::now_seconds();
  prov.hosts = gather_hosts(comm);
  const std::string host_name = [] {
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    return std::string(name);
  }();
  prov.world_size = world;
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v != nullptr ? v : "";
  };
  prov.slurm_job_id = env("SLURM_JOB_ID");
  prov.slurm_array_job_id = env("SLURM_ARRAY_JOB_ID");
  prov.slurm_array_task_id = env("SLURM_ARRAY_TASK_ID");
  prov.slurm_nodelist = env("SLURM_JOB_NODELIST");
  prov.slurm_tasks_per_node = env("SLURM_TASKS_PER_NODE");
  prov.deck_path = deck.path;
  prov.deck_text = deck.text;
  prov.resolved_config = deck.resolved_toml;
  prov.backend = kernels::backend_name();
  prov.threads = kernels::num_threads();
  prov.parameters = params;
  describe_software(prov, comm::library_versions(comm_backend), kernels::library_versions());

  const Peak peak = resolve_peak(cfg, comm);
  // MFU compares the job's model FLOP/s with the summed peak of its ranks.
  double job_peak = peak.flops_per_s;
  STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &job_peak, 1, MPI_DOUBLE, MPI_SUM, comm));
  prov.peak_flops = job_peak;
  prov.peak_flops_per_device = peak.flops_per_s;
  prov.peak_source = peak.source;

  report::H5File file(comm, out_path);
  // Two communicators of the run's own for ending it (run_control.hpp).
  const DupComm control(comm), failures(comm);
  write_provenance(file, prov);
  file.set_attr("/", "device", std::string(plan::name_of(cfg.backend.device)));
  file.set_attr("/", "comm_backend", comm::describe_backend(comm_backend));
  if (!resume.dir.empty()) {
    file.set_attr("/", "resumed_from", resume.dir);
    file.set_attr("/", "resumed_at_step", std::int64_t(resume.step));
  }

  prov.layout = mesh::describe(layout);
  DeviceArena arena;  // declared before the tracker: freed after it
  core::MemoryTracker tracker(cfg.backend.memory_limit);
  std::vector<StepRecord> steps;
  std::vector<ExpertRecord> experts;  // MoE routing, copied after every step
  std::vector<MemoryRecord> memory;
  // The headline figures, computed once from the records: written to the
  // report and printed.
  const int micro_batches = cfg.data.global_batch / (cfg.data.micro_batch * cfg.parallel.dp);
  Summary summary;
  std::vector<CommAggregate> comm_figures;
  Bubble bubble;
  // The records so far, and the status, into a report: every rank's rows
  // into the run's report, or one failing rank's alone into its own.
  auto finish = [&](report::H5File& to, const char* status, MPI_Comm together) {
    const models::Family& family = models::family(cfg);
    summary = summarise(steps, memory, family.model_flops(cfg, cfg.data.global_batch),
                        family.hardware_flops(cfg, cfg.data.global_batch), job_peak);
    take_largest_rank_memory(summary, together);
    const auto axis_comm = [&](std::string_view axis) { return mesh.mpi_comm(axis); };
    const bool all_completed = std::string_view(status) != "failed";
    if (all_completed) share_progress_with_group(log, axes, axis_comm);
    comm_figures = aggregate_comm(log, cfg.run.warmup_steps);
    if (all_completed) take_group_transfer_times(comm_figures, axes, axis_comm);
    bubble = measure_bubble(timeline, steps, mesh.coord("pp"), stages, micro_batches, chunks, *cfg.parallel.schedule);
    write_tables(to, layout,
                 {{rank, &steps, &experts, cfg.run.profile ? &timeline : nullptr, &log, host_name}}, memory);
    write_comm_summary(to, {{rank, comm_figures}});
    write_pipeline_summary(to, {{rank, bubble}});
    write_summary(to, summary, prov);
    if (!kernels::host_memory()) {
      // The driver's view beside the tracker's: the arena, the context,
      // cuBLAS and NCCL together.
      const kernels::DeviceMemory m = kernels::device_memory();
      to.set_attr("/", "device_memory_used", std::int64_t(m.total - m.free));
    }
    to.set_attr("/", "end_time", iso_time_utc());
    to.set_attr("/", "duration", prof::now_seconds() - started);
    to.set_attr("/", "status", status);
  };
  StepConsole console{cfg.run.steps, world, cfg.backend.precision == core::Precision::fp16,
                      cfg.model.moe_experts > 0};
  const std::string warning = cores_shared_warning(comm, kernels::num_threads());
  if (!warning.empty()) file.set_attr("/", "warnings", warning);
  // How the loop ended, agreed by every rank; failure: this rank's error.
  enum class Outcome { complete, diverged, interrupted } outcome = Outcome::complete;
  int stopped_by = 0, diverged_at = -1;
  std::string failure;
  bool agreed = false;  // every rank threw the same error at the same point

  try {
    if (!kernels::host_memory()) {
      // Inside: a GPU without room on one rank is a failure like any other.
      timeline.set_fence(kernels::synchronize);
      arena.open(cfg.backend.memory_limit, tracker, sharing_gpu, comm);
      file.set_attr("/", "device_arena_bytes", std::int64_t(arena.capacity));
      file.set_attr("/", "device_memory_total", std::int64_t(kernels::device_memory().total));
    }
    Trainer trainer(cfg, tracker, &timeline, job_peak, strategies::parallelize(cfg, &mesh));
    // Room for every record up front: a growing log would pay page faults
    // inside the measured calls. Per micro-batch a unit has at most a gather,
    // a prefetch and a reduce-scatter; per step, buckets and a few scalars.
    const std::size_t units = trainer.model().units().size();
    log.reserve(std::size_t(cfg.run.steps) * (3 * units * std::size_t(trainer.micro_batches()) + units + 64));
    prov.strategy = trainer.strategy().name();
    prov.precision = core::precision_name(cfg.backend.precision);
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
                 double(params) / 1e6, trainer.data().describe());
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
    console.first_step = resume.step;
    console.started = prof::now_seconds();
    const InjectedFailure inject = injected_failure();
    for (int s = resume.step; s < cfg.run.steps; ++s) {
      if (rank == inject.rank && s == inject.step)
        core::runtime_error("failure injected by STRATA_INJECT_FAILURE at step {}", s);
      log.set_step(s);
      tracker.reset_peaks();
      const std::size_t first_record = log.records().size();
      steps.push_back(trainer.step(s));
      experts.insert(experts.end(), trainer.expert_records().begin(), trainer.expert_records().end());
      for (const auto& m : memory_records(rank, s, rank_memory(tracker, trainer.host_tracker(), trainer.nvme_file()), cfg))
        memory.push_back(m);
      StepRecord& r = steps.back();
      r.exposed_comm.assign(axes.size(), 0.0);
      for (std::size_t i = first_record; i < log.records().size(); ++i) {
        const comm::CommRecord& c = log.records()[i];
        const auto a = std::find(axes.begin(), axes.end(), c.axis);
        if (a != axes.end()) r.exposed_comm[std::size_t(a - axes.begin())] += c.wait;
      }
      // The step boundary: signals, divergence and the step's time, agreed.
      // An fp16 overflow that the loss scale skipped is not divergence; its
      // loss is finite.
      const Boundary b = agree_at_boundary(
          control.comm, !std::isfinite(r.loss) || (!std::isfinite(r.grad_norm) && !r.skipped), r.rank_step_time);
      r.set_time(b.slowest_step_time, job_peak);
      const int every = cfg.run.log_every;
      if (rank == 0 && every > 0 && (s % every == 0 || s == cfg.run.steps - 1)) console.line(r);
      if (b.diverged && diverged_at < 0) {
        diverged_at = s;
        if (rank == 0)
          fmt::print("step {}: the loss or the gradient norm is not finite{}\n", s,
                     cfg.run.on_divergence == plan::OnDivergence::stop ? "; stopping (run.on_divergence = \"stop\")"
                                                                       : "; continuing (run.on_divergence = \"continue\")");
      }
      if (b.diverged && cfg.run.on_divergence == plan::OnDivergence::stop) {
        outcome = Outcome::diverged;  // no checkpoint of diverged weights
        break;
      }
      const bool stopping = b.signal != 0 && s + 1 < cfg.run.steps;
      const bool due = options.checkpoint_every > 0 && (s + 1) % options.checkpoint_every == 0;
      if (due || (stopping && options.checkpoint_every > 0)) {
        const std::string path =
            write_checkpoint(comm, checkpoint_dir, s + 1, ck_layout, trainer.strategy(), trainer.registry(),
                             mesh::first_copy(layout, rank), trainer.scaler());
        if (rank == 0) fmt::print("checkpoint: {}\n", path);
      }
      if (stopping) {
        outcome = Outcome::interrupted;
        stopped_by = b.signal;
        if (rank == 0)
          fmt::print("{}: stopped after step {} of {}{}\n", signal_name(b.signal), s, cfg.run.steps,
                     options.checkpoint_every > 0 ? "" : " (no checkpoint: --checkpoint-every is 0)");
        break;
      }
    }
  } catch (const core::Error& e) {
    failure = e.what();
    agreed = e.agreed();
  } catch (const std::exception& e) {
    failure = e.what();
    if (failure.empty()) failure = "an error without a message";
  }

  if (!failure.empty()) {
    // Every rank failed alike (a memory limit they all exceed, a checkpoint
    // they all refuse): they agree on the message and publish the report
    // together. Otherwise the others wait in a collective for this rank:
    // it publishes a report of its own records and ends the job.
    if (!agreed && !every_rank_failed(failures.comm, kAgreeSeconds)) {
      try {
        // The run's path gets this rank's records, marked as its alone; the
        // shared temporary file goes (the job's end stops its writers).
        report::H5File alone(MPI_COMM_SELF, file.final_path(), fmt::format(".rank{}.partial", rank));
        write_provenance(alone, prov);
        alone.set_attr("/", "error", fmt::format("rank {}: {}", rank, failure));
        alone.set_attr("/", "failed_rank", std::int64_t(rank));
        alone.set_attr("/", "rows_of_ranks", std::to_string(rank));
        finish(alone, "failed", MPI_COMM_SELF);
        alone.publish();
        std::filesystem::remove(file.temp_path());
        std::fprintf(stderr, "strata: rank %d wrote its own records to %s\n", rank, alone.final_path().c_str());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "strata: rank %d could not write its report: %s\n", rank, e.what());
      }
      report_claim.release();
      if (checkpoint_claim) checkpoint_claim->release();
      comm::abort_job(comm, rank, failure, 1);
    }
    // The report itself failed (agreed): nothing more can be written to it.
    if (file.broken()) throw core::Error(core::ErrorKind::runtime, failure, true);
    // An error the ranks already agreed on (a checkpoint's) is one message.
    const std::string message = agreed ? failure : agreed_message(comm, failure);
    file.set_attr("/", "error", message);
    if (diverged_at >= 0) file.set_attr("/", "diverged_at_step", std::int64_t(diverged_at));
    finish(file, "failed", comm);
    file.publish();
    // Thrown, agreed, rather than returned: the communicators and the GPU
    // arena are then destroyed while unwinding, which aborts NCCL's
    // communicators instead of waiting for operations a failed step left.
    throw core::Error(core::ErrorKind::runtime,
                      fmt::format("{}\nreport: {} (status failed)", message, file.final_path()), true);
  }
  const char* status = outcome == Outcome::diverged ? "diverged" : outcome == Outcome::interrupted ? "interrupted" : "complete";
  if (diverged_at >= 0) file.set_attr("/", "diverged_at_step", std::int64_t(diverged_at));
  if (outcome == Outcome::interrupted) file.set_attr("/", "interrupted_by", std::string(signal_name(stopped_by)));
  finish(file, status, comm);
  // STRATA_INJECT_REPORT_KILL=RANK: that rank is killed with everything
  // written but not published (the fault tests: nothing poses as complete,
  // and the next run on the path takes over the stale claim).
  if (const char* v = std::getenv("STRATA_INJECT_REPORT_KILL"); v != nullptr && std::atoi(v) == rank)
    std::raise(SIGKILL);
  file.publish();

  const Summary& s = summary;
  print_memory_per_rank(comm, memory, steps.empty() ? -1 : steps.back().step);
  if (stages > 1 && cfg.run.profile) print_bubbles(comm, bubble, cfg.parallel.schedule->formula);
  if (rank == 0) {
    fmt::print("summary: loss {:.4f} -> {:.4f} | {:.0f} tokens/s (median of {} steps) | {:.2f} GFLOP/s | MFU {:.1f}%{}\n",
               s.initial_loss, s.final_loss, s.tokens_per_s, s.measured_steps, s.flops_per_s / 1e9, 100 * s.mfu,
               s.hardware_flops_per_step > s.model_flops_per_step ? fmt::format(" | HFU {:.1f}%", 100 * s.hfu) : "");
    if (!comm_figures.empty()) {
      fmt::print("communication on rank 0 over {} measured steps:\n", s.measured_steps);
      fmt::print("  {:<10} {:<15} {:>3} {:>11} {:>7} {:>12} {:>10} {:>10} {:>10} {:>8}\n", "axis", "op", "n",
                 "size <=", "calls", "bytes", "xfer_ms", "algbw_GB/s", "busbw_GB/s", "hidden");
      for (const auto& a : comm_figures)
        fmt::print("  {:<10} {:<15} {:>3} {:>11} {:>7} {:>12.0f} {:>10.2f} {:>10.3f} {:>10.3f} {:>7.0f}%\n", a.axis,
                   a.op, a.group_size, core::format_bytes(double(a.size_class)), a.count, a.bytes, a.group_time * 1e3,
                   a.algbw() / 1e9, a.busbw() / 1e9, 100.0 * a.hidden_fraction());
    }
    fmt::print("report: {}\n", file.final_path());
  }
  if (outcome == Outcome::diverged) return 3;
  if (outcome == Outcome::interrupted) return interrupted_exit_code(stopped_by);
  return 0;
}

}  // namespace strata::train
