// What a training run writes to its HDF5 report (schema "strata-report",
// version 1): provenance on the root, the /steps, /memory and /timeline
// tables with a rank column, and the /summary headline figures.
// docs/report-schema.md documents every name written here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "src/comm/comm_log.hpp"
#include "kernels/foundation/memory.hpp"
#include "kernels/foundation/timeline.hpp"
#include "src/deck/deck.hpp"
#include "src/report/h5file.hpp"
#include "src/train/memory_figures.hpp"
#include "src/train/trainer.hpp"
#include "strategies/axes.hpp"

namespace strata::train {

inline constexpr const char* kSchemaName = "strata-report";
inline constexpr std::int64_t kSchemaVersion = 1;

struct Provenance {
  std::string command_line;
  std::string start_time;   // ISO 8601, UTC
  std::string hosts;        // comma-separated, unique, in rank order
  int world_size = 1;
  std::string slurm_job_id; // empty outside SLURM
  std::string slurm_array_job_id, slurm_array_task_id;  // empty outside a job array
  std::string slurm_nodelist, slurm_tasks_per_node;
  std::string deck_path;
  std::string deck_text;
  std::string resolved_config;
  std::string backend;
  int threads = 1;
  std::string data;
  std::int64_t parameters = 0;
  double peak_flops = 0;       // the job's: every rank's summed
  double peak_flops_per_device = 0;
  std::string peak_source;
  std::string layout;          // "pp 1 x dp 2 x tp 1"
  std::string strategy;        // "dp", "zero1", ...
  std::string precision = "fp32";  // backend.precision
  std::string offload_io;          // NVMe offload: "O_DIRECT" or "buffered (why)"; empty otherwise
  // The software and hardware the figures came from.
  std::string mpi_library, hdf5_library, kernel_libraries, compiler, cpu_model;
  std::int64_t padding_elements = 0;
};

// One row of /memory: a pool's category over a step of a rank.
struct MemoryRecord {
  int rank;
  int step;
  core::Pool pool;
  core::MemCategory category;
  std::uint64_t current;
  std::uint64_t peak;
  std::uint64_t pool_peak;  // the pool's most bytes at once over the step
};
// Whether a plan's runs use pool p: the device always, the host arena with
// offload, the NVMe file with NVMe offload.
bool uses_pool(const plan::Plan& p, core::Pool pool);
// A rank's rows for one step, one per category of every pool the plan uses.
std::vector<MemoryRecord> memory_records(int rank, int step, const RankMemory& m, const plan::Plan& p);
// The /memory table (rows of any ranks: a run passes its own, an estimate
// every rank's).
report::Table memory_table(const std::vector<MemoryRecord>& memory);
void write_memory_table(report::H5File& f, const std::vector<MemoryRecord>& memory);

struct Summary {
  int measured_steps = 0;
  double tokens_per_s = 0;     // median over measured steps
  double step_time = 0;        // median
  double model_flops_per_step = 0;
  double flops_per_s = 0;      // model FLOPs / median step time
  double mfu = 0;
  double hardware_flops_per_step = 0;  // model FLOPs plus recomputation
  double hfu = 0;
  double initial_loss = 0, final_loss = 0;
  int skipped_steps = 0;  // fp16 overflows
  // Device memory of the rank with the largest total (set_largest_rank):
  // what must fit on every device.
  std::uint64_t peak_bytes[core::kNumMemCategories] = {};
  std::uint64_t peak_total = 0;
  int peak_rank = 0;
};

// What the summary needs of a run's steps, taken a step at a time: the time
// and rate of each measured step (whose medians it reports: 16 B a step),
// and the rest folded in as the records come.
struct RunningSummary {
  std::vector<double> times, rates;  // measured steps
  int steps = 0, skipped_steps = 0;
  double initial_loss = 0, final_loss = 0;
  std::uint64_t peak_bytes[core::kNumMemCategories] = {};  // the device's, over every step
  std::uint64_t held_bytes[core::kNumMemCategories] = {};  // the device's at the end of the last step
  int last_step = -1;
  void add(const StepRecord& r);
  void add(const MemoryRecord& m);
  Summary finish(double model_flops_per_step, double hardware_flops_per_step, double peak_flops) const;
};

Summary summarise(const std::vector<StepRecord>& steps, const std::vector<MemoryRecord>& memory,
                  double model_flops_per_step, double hardware_flops_per_step, double peak_flops);

// Collective over `comm`: the memory figures of the rank whose total is the
// largest (the lowest such rank), on every rank.
void take_largest_rank_memory(Summary& s, MPI_Comm comm);

// Now, as ISO 8601 in UTC: a report's start_time.
std::string iso_time_utc();

// What every report of a deck says of where it came from, built here once
// for a run, an estimate and a simulation alike: the command line, the deck
// as read and as resolved, its layout, state strategy, precision and
// parameters, the world and the threads, on `backend` ("cpu", "meta",
// "simulated: h100-80gb"); no hosts ("-"). A run adds its hosts and job
// (describe_job), its software (describe_software) and its peak.
Provenance provenance(const deck::Deck& deck, const std::string& command_line, const std::string& backend);
// The hosts of the ranks of `comm` (unique, in rank order) and their SLURM
// job. Collective.
void describe_job(Provenance& p, MPI_Comm comm);
// The compiler, HDF5 and the CPU's model into p, with the given MPI (and
// NCCL) and kernel libraries.
void describe_software(Provenance& p, const std::string& comm_libraries, const std::string& kernel_libraries);
void write_provenance(report::H5File& f, const Provenance& p);
// One rank's rows of the per-rank tables.
struct RankRows {
  int rank = 0;
  const std::vector<StepRecord>* steps = nullptr;
  const std::vector<ExpertRecord>* experts = nullptr;  // null: none
  const prof::Timeline* timeline = nullptr;            // null: none
  const comm::CommLog* comm = nullptr;                 // null: none
  std::string host;                                    // where the rank ran (/ranks)
};
// /ranks, /steps, /experts, /memory, /timeline and /comm of a run on
// `layout`: /ranks has a column per dim, /steps one of exposed
// communication per axis. A run passes its own rank's rows (every rank
// calls it, collectively); a simulation one rank's of each rank class.
void write_tables(report::H5File& f, const mesh::Layout& layout, const std::vector<RankRows>& ranks,
                  const std::vector<MemoryRecord>& memory);
// The same tables, built: /ranks, and the tables of per-step rows (/steps,
// /experts, /memory, /timeline and /comm), which a run appends a window of
// steps at a time.
report::Table ranks_table(const mesh::Layout& layout, const std::vector<RankRows>& ranks);
// /rank_classes and the root attribute rank_rows = "classes" of a report
// whose ranks come in classes of identical ones (an estimate's, a
// simulation's): the other tables then hold the rows of each class's first
// rank alone, so that the report's size follows the classes, not the world.
// `classes` are the member ranks of each, ascending, together every rank
// once; a row per run of consecutive members.
report::Table rank_classes_table(const std::vector<std::vector<int>>& classes);
void write_rank_classes(report::H5File& f, const std::vector<std::vector<int>>& classes);
std::vector<report::Table> step_tables(const mesh::Layout& layout, const std::vector<RankRows>& ranks,
                                       const std::vector<MemoryRecord>& memory);

// Per axis, op, group size and message-size class over this rank's records:
// what /summary/comm holds. The class keeps an 8-byte scalar all-reduce out
// of the row of the 4 MiB gradient buckets, whose bandwidth it would drown.
struct CommAggregate {
  std::string axis, op;
  int group_size = 0;
  std::int64_t size_class = 0;  // bytes per call in (size_class / 2, size_class]; 0 for empty calls
  std::int64_t count = 0;
  double bytes = 0;
  double time = 0;       // summed transfer time (comm::CommRecord::transfer)
  double group_time = 0; // collectives: the largest `time` of the group's members (take_group_transfer_times); else time
  double span = 0;       // summed end - start: issued to seen complete
  double wait = 0;       // summed time blocked
  double peer_wait = 0;  // recv: summed time before the peer's message arrived
  // Collectives: the part of `time` spent waiting for the group's last
  // member: this rank's time less the least of its members' (a run:
  // take_group_transfer_times), or the time blocked beyond the transfer
  // (a simulation, whose transfer is its own); else 0.
  double group_wait = 0;
  double algbw() const { return group_time > 0 ? bytes / group_time : 0; }
  double hidden_fraction() const { return span > 0 ? std::max(0.0, 1.0 - wait / span) : 0; }
  double busbw() const;  // algbw x the nccl-tests factor of the op
};
// The power of two a call of `bytes` falls under (0 for 0).
std::int64_t size_class(std::int64_t bytes);
std::vector<CommAggregate> aggregate_comm(const comm::CommLog& log, int first_step);
// The log's records of steps from first_step on added into `rows` (a run's
// aggregates, a window of records at a time).
void add_to_aggregates(std::vector<CommAggregate>& rows, const comm::CommLog& log, int first_step);
// A collective's transfer is done only when every member has done its part
// (on the host a member's share progresses only while it is inside MPI,
// and a peer may do part of it meanwhile), so the group's transfer time for
// a row of collectives is the largest of its members'. Collective over the
// communicator of each of `axes`, `comm_of(axis)`: only after a run whose
// collectives all completed (a failed run keeps each rank's own).
void take_group_transfer_times(std::vector<CommAggregate>& rows, const std::vector<std::string>& axes,
                               const std::function<MPI_Comm(std::string_view)>& comm_of);
// Refines the host estimate of each non-blocking collective's transfer
// (comm::HostProgress): of the shares of time inside MPI the call was given,
// only the parts during which every member of its group was inside MPI too
// count, for a rank alone inside MPI moves little of a collective. Rewrites
// the records' transfer_start (transfer_end stays when the call was seen
// complete). Collective over the communicator of each of `axes`,
// `comm_of(axis)`: only after a run whose collectives all completed, and
// before aggregate_comm.
void share_progress_with_group(comm::CommLog& log, const std::vector<std::string>& axes,
                               const std::function<MPI_Comm(std::string_view)>& comm_of);
void write_comm_summary(report::H5File& f, const std::vector<std::pair<int, std::vector<CommAggregate>>>& per_rank);

// The pipeline bubble of this rank over the measured steps: pipeline time =
// step time - the optimizer span; busy = summed forward and backward spans of
// the step; idle = pipeline time - busy.
struct Bubble {
  int pp_rank = 0, stages = 1, micro_batches = 1, virtual_stages = 1;
  std::string schedule;
  double idle_over_step = 0;     // idle / pipeline time (median over measured steps)
  double idle_over_compute = 0;  // idle / busy: the convention of "bubble time over ideal time"
  double theory = 0;             // the schedule's with unit costs (strategies::pp::ScheduleInfo::bubble)
};
// A step's spans split as the bubble takes them: the optimizer span, and
// the forward and backward spans (busy), in seconds, by global step.
struct StepSpans {
  double busy = 0, optimizer = 0;
  double pipeline(double step_time) const { return step_time - optimizer; }
  double idle(double step_time) const { return std::max(0.0, pipeline(step_time) - busy); }
};
std::map<int, StepSpans> spans_by_step(const prof::Timeline& timeline);
// The bubble's two ratios of each measured step (16 B a step), whose
// medians measure_bubble takes: from a timeline and the records of its steps.
struct BubbleSamples {
  std::vector<double> over_step, over_compute;
  void add(const prof::Timeline& timeline, const std::vector<StepRecord>& steps);
};
Bubble measure_bubble(const BubbleSamples& samples, int pp_rank, int stages, int micro_batches, int virtual_stages,
                      const strategies::pp::ScheduleInfo& schedule);
Bubble measure_bubble(const prof::Timeline& timeline, const std::vector<StepRecord>& steps, int pp_rank, int stages,
                      int micro_batches, int virtual_stages, const strategies::pp::ScheduleInfo& schedule);
void write_pipeline_summary(report::H5File& f, const std::vector<std::pair<int, Bubble>>& per_rank);
// A run's rank's host memory: its process's peak resident set and the most
// its records held (RunRecords), as /summary/host_memory.
struct HostMemory {
  int rank = 0;
  std::int64_t peak_rss = 0, records_bytes = 0;
};
void write_host_memory_summary(report::H5File& f, const std::vector<HostMemory>& per_rank);
void write_summary(report::H5File& f, const Summary& s, const Provenance& p);

}  // namespace strata::train
