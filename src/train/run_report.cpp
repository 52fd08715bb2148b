#include "src/train/run_report.hpp"

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <set>
#include <fstream>
#include <map>

#include <fmt/format.h>

#include "git_state.hpp"
#include "kernels/foundation/median.hpp"
#include "src/comm/mpi_check.hpp"
#include "kernels/kernels.hpp"
#include "models/model.hpp"
#include "strategies/pp/schedule.hpp"
#include "strategies/registry.hpp"

namespace strata::train {

using core::median;

void RunningSummary::add(const StepRecord& r) {
  if (!r.warmup) {
    times.push_back(r.step_time);
    rates.push_back(r.tokens_per_s);
  }
  skipped_steps += r.skipped;
  if (steps == 0) initial_loss = r.loss;
  final_loss = r.loss;
  ++steps;
}

void RunningSummary::add(const MemoryRecord& m) {
  if (m.pool != core::Pool::device) return;  // the device's figures; the host arena is reported apart
  auto& p = peak_bytes[int(m.category)];
  p = std::max(p, m.peak);
  if (m.step > last_step) {
    last_step = m.step;
    std::fill(std::begin(held_bytes), std::end(held_bytes), 0);
  }
  if (m.step == last_step) held_bytes[int(m.category)] = m.current;
}

Summary RunningSummary::finish(double model_flops_per_step, double hardware_flops_per_step, double peak_flops) const {
  Summary s;
  s.measured_steps = int(times.size());
  s.step_time = median(times);
  s.tokens_per_s = median(rates);
  s.model_flops_per_step = model_flops_per_step;
  s.flops_per_s = s.step_time > 0 ? model_flops_per_step / s.step_time : 0;
  s.mfu = peak_flops > 0 ? s.flops_per_s / peak_flops : 0;
  s.hardware_flops_per_step = hardware_flops_per_step;
  s.hfu = peak_flops > 0 && s.step_time > 0 ? hardware_flops_per_step / s.step_time / peak_flops : 0;
  s.skipped_steps = skipped_steps;
  s.initial_loss = initial_loss;
  s.final_loss = final_loss;
  std::copy(std::begin(peak_bytes), std::end(peak_bytes), std::begin(s.peak_bytes));
  for (auto b : s.peak_bytes) s.peak_total += b;
  return s;
}

Summary summarise(const std::vector<StepRecord>& steps, const std::vector<MemoryRecord>& memory,
                  double model_flops_per_step, double hardware_flops_per_step, double peak_flops) {
  RunningSummary r;
  for (const auto& x : steps) r.add(x);
  for (const auto& m : memory) r.add(m);
  return r.finish(model_flops_per_step, hardware_flops_per_step, peak_flops);
}

void take_largest_rank_memory(Summary& s, MPI_Comm comm) {
  int rank = 0;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  struct {
    double total;
    int rank;
  } mine{double(s.peak_total), rank}, largest{};
  STRATA_CHECK_MPI(MPI_Allreduce(&mine, &largest, 1, MPI_DOUBLE_INT, MPI_MAXLOC, comm));
  static_assert(sizeof(s.peak_bytes[0]) == sizeof(std::uint64_t));
  STRATA_CHECK_MPI(MPI_Bcast(s.peak_bytes, core::kNumMemCategories, MPI_UINT64_T, largest.rank, comm));
  s.peak_total = 0;
  for (auto b : s.peak_bytes) s.peak_total += b;
  s.peak_rank = largest.rank;
}

bool uses_pool(const plan::Plan& p, core::Pool pool) {
  switch (pool) {
    case core::Pool::host: return p.parallel.offload != plan::Offload::none;
    case core::Pool::nvme: return p.parallel.offload == plan::Offload::nvme;
    default: return true;
  }
}

std::vector<MemoryRecord> memory_records(int rank, int step, const RankMemory& m, const plan::Plan& plan) {
  std::vector<MemoryRecord> out;
  for (int p = 0; p < core::kNumPools; ++p) {
    const auto pool = core::Pool(p);
    if (!uses_pool(plan, pool)) continue;
    const PoolFigures& f = m[pool];
    for (int c = 0; c < core::kNumMemCategories; ++c)
      out.push_back({rank, step, pool, core::MemCategory(c), f.held[std::size_t(c)], f.peak[std::size_t(c)],
                     f.total_peak});
  }
  return out;
}

report::Table memory_table(const std::vector<MemoryRecord>& memory) {
  report::Table mem("memory", "tracked bytes per step, rank, pool and category");
  mem.col_i64("rank", "1", "MPI rank in the world communicator")
      .col_i64("step", "1", "0-based optimizer step")
      .col_str("category", 16, "", "params, grads, optimizer, activations, workspace or comm")
      .col_str("pool", 8, "", "device; host (the arena optimizer offload keeps its state in); nvme (the offload file)")
      .col_i64("current_bytes", "B", "bytes held at the end of the step")
      .col_i64("peak_bytes", "B", "largest bytes held at any moment of the step")
      .col_i64("pool_peak_bytes", "B", "largest bytes of the whole pool held at once during the step");
  for (const auto& m : memory)
    mem.add_row({std::int64_t(m.rank), std::int64_t(m.step), std::string(core::category_name(m.category)),
                 std::string(core::pool_name(m.pool)), std::int64_t(m.current), std::int64_t(m.peak),
                 std::int64_t(m.pool_peak)});
  return mem;
}

void write_memory_table(report::H5File& f, const std::vector<MemoryRecord>& memory) {
  f.write_table(memory_table(memory));
}

std::string iso_time_utc() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

Provenance provenance(const deck::Deck& deck, const std::string& command_line, const std::string& backend) {
  const plan::Plan& cfg = deck.config;
  const mesh::Layout layout = strategies::layout_of(cfg);
  Provenance p;
  p.command_line = command_line;
  p.start_time = iso_time_utc();
  p.hosts = std::string(1, '-');  // none until a job describes its own (a literal here trips GCC 12's -Wrestrict)
  p.world_size = layout.world();
  p.deck_path = deck.path;
  p.deck_text = deck.text;
  p.resolved_config = deck.resolved_toml;
  p.backend = backend;
  p.threads = kernels::num_threads();
  p.parameters = models::parameter_count(cfg);
  p.layout = mesh::describe(layout);
  const strategies::StateRow& state = strategies::chosen_state(cfg);
  p.strategy = state.label(cfg);
  p.precision = core::precision_name(cfg.backend.precision);
  return p;
}

// Every rank's processor name, unique, in rank order.
namespace {

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

}  // namespace

void describe_job(Provenance& p, MPI_Comm comm) {
  p.hosts = gather_hosts(comm);
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v != nullptr ? v : "";
  };
  p.slurm_job_id = env("SLURM_JOB_ID");
  p.slurm_array_job_id = env("SLURM_ARRAY_JOB_ID");
  p.slurm_array_task_id = env("SLURM_ARRAY_TASK_ID");
  p.slurm_nodelist = env("SLURM_JOB_NODELIST");
  p.slurm_tasks_per_node = env("SLURM_TASKS_PER_NODE");
}

void describe_software(Provenance& p, const std::string& comm_libraries, const std::string& kernel_libraries) {
  p.mpi_library = comm_libraries;
  p.hdf5_library = report::hdf5_version();
  p.kernel_libraries = kernel_libraries;
#if defined(__clang__)
  p.compiler = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  p.compiler = std::string("g++ ") + __VERSION__;
#else
  p.compiler = "unknown";
#endif
  p.cpu_model = "unknown";
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) p.cpu_model = line.substr(line.find_first_not_of(' ', colon + 1));
      break;
    }
}

void write_provenance(report::H5File& f, const Provenance& p) {
  f.set_attr("/", "schema", kSchemaName);
  f.set_attr("/", "schema_version", kSchemaVersion);
  f.set_attr("/", "strata_version", STRATA_VERSION);
  f.set_attr("/", "git_commit", STRATA_GIT_COMMIT);
  f.set_attr("/", "git_dirty", std::int64_t(STRATA_GIT_DIRTY));
  f.set_attr("/", "mpi_library", p.mpi_library);
  f.set_attr("/", "hdf5_library", p.hdf5_library);
  f.set_attr("/", "kernel_libraries", p.kernel_libraries);
  f.set_attr("/", "compiler", p.compiler);
  f.set_attr("/", "cpu_model", p.cpu_model);
  f.set_attr("/", "command_line", p.command_line);
  f.set_attr("/", "start_time", p.start_time);
  f.set_attr("/", "hosts", p.hosts);
  f.set_attr("/", "world_size", std::int64_t(p.world_size));
  f.set_attr("/", "slurm_job_id", p.slurm_job_id);
  f.set_attr("/", "slurm_array_job_id", p.slurm_array_job_id);
  f.set_attr("/", "slurm_array_task_id", p.slurm_array_task_id);
  f.set_attr("/", "slurm_nodelist", p.slurm_nodelist);
  f.set_attr("/", "slurm_tasks_per_node", p.slurm_tasks_per_node);
  f.set_attr("/", "deck_path", p.deck_path);
  f.set_attr("/", "deck", p.deck_text);
  f.set_attr("/", "resolved_config", p.resolved_config);
  f.set_attr("/", "backend", p.backend);
  f.set_attr("/", "threads", std::int64_t(p.threads));
  f.set_attr("/", "data", p.data);
  f.set_attr("/", "offload_io", p.offload_io);
  f.set_attr("/", "simulated", std::int64_t(0));
  f.set_attr("/", "status", "running");
}

report::Table ranks_table(const mesh::Layout& layout, const std::vector<RankRows>& ranks) {
  report::Table rk("ranks", "one row per rank: where it ran and its coordinate along each dim of the process mesh");
  rk.col_i64("rank", "1", "MPI rank in the world communicator")
      .col_str("host", 64, "", "the processor name of the rank's node (MPI_Get_processor_name; \"simulated\" in a simulation)");
  for (const mesh::Dim& d : layout.dims) rk.col_i64(d.name, "1", d.doc);
  for (const RankRows& rr : ranks) {
    const std::vector<int> at = mesh::coords_of(layout, rr.rank);
    std::vector<report::Cell> row(2 + at.size());
    row[0] = std::int64_t(rr.rank);
    row[1] = rr.host.substr(0, 64);
    for (std::size_t d = 0; d < at.size(); ++d) row[2 + d] = std::int64_t(at[d]);
    rk.add_row(row);
  }
  return rk;
}

report::Table rank_classes_table(const std::vector<std::vector<int>>& classes) {
  report::Table t("rank_classes", "classes of identical ranks: the first rank of each stands for all of them in the "
                                  "rank column of the other tables; one row per run of consecutive ranks of a class");
  t.col_i64("rank", "1", "the first rank of the class: the rank its rows carry in the other tables")
      .col_i64("first", "1", "the first rank of a run of consecutive ranks of the class")
      .col_i64("last", "1", "the last rank of the run (inclusive)");
  for (const std::vector<int>& k : classes)
    for (std::size_t i = 0; i < k.size();) {
      std::size_t j = i;
      while (j + 1 < k.size() && k[j + 1] == k[j] + 1) ++j;
      t.add_row({std::int64_t(k.front()), std::int64_t(k[i]), std::int64_t(k[j])});
      i = j + 1;
    }
  return t;
}

void write_rank_classes(report::H5File& f, const std::vector<std::vector<int>>& classes) {
  f.write_table(rank_classes_table(classes));
  f.set_attr("/", "rank_rows", "classes");
}

std::vector<report::Table> step_tables(const mesh::Layout& layout, const std::vector<RankRows>& ranks,
                                       const std::vector<MemoryRecord>& memory) {
  std::vector<report::Table> out;
  report::Table st("steps", "one row per optimizer step and rank");
  st.col_i64("rank", "1", "MPI rank in the world communicator")
      .col_i64("step", "1", "0-based optimizer step")
      .col_i64("warmup", "1", "1 if the step is a warm-up step, excluded from timing summaries")
      .col_f64("loss", "nats/token", "mean cross-entropy over the global batch")
      .col_f64("lr", "1", "learning rate used by this step")
      .col_f64("grad_norm", "1", "global L2 norm of the gradient before clipping")
      .col_i64("clipped", "1", "1 if the gradient was scaled down by optim.grad_clip")
      .col_f64("step_time", "s",
               "the step's time: the slowest rank's wall time for data, forward, backward and optimizer (the same "
               "on every rank; the rates below come from it)")
      .col_f64("rank_step_time", "s", "this rank's own wall time for the step")
      .col_f64("tokens", "tokens", "tokens in the global batch (global_batch x seq_len)")
      .col_f64("tokens_per_s", "tokens/s", "tokens / step_time")
      .col_f64("model_flops", "FLOP", "model FLOPs of the step (forward + backward, no recomputation)")
      .col_f64("flops_per_s", "FLOP/s", "model_flops / step_time")
      .col_f64("mfu", "1", "flops_per_s / peak FLOP/s (see /summary/peak_flops)")
      .col_f64("hardware_flops", "FLOP", "FLOPs executed: model_flops plus the recomputed forward work")
      .col_f64("hfu", "1", "hardware FLOPs utilisation: hardware_flops / step_time / peak FLOP/s")
      .col_f64("offload_bytes_to_host", "B", "optimizer offload: gradients and parameters copied to the host")
      .col_f64("offload_bytes_to_device", "B", "optimizer offload: updated parameters copied back")
      .col_f64("offload_copy_time", "s", "optimizer offload: summed duration of those copies (on copy threads)")
      .col_f64("offload_copy_wait", "s", "optimizer offload: the part of it the optimizer step waited for (the rest was hidden)")
      .col_f64("offload_update_time", "s", "optimizer offload: AdamW on the host (NVMe: with its waits for I/O)")
      .col_f64("nvme_bytes_read", "B", "NVMe offload: optimizer state read from the rank's file")
      .col_f64("nvme_bytes_written", "B", "NVMe offload: optimizer state written back")
      .col_f64("nvme_io_time", "s", "NVMe offload: summed duration of those transfers (on I/O threads)")
      .col_f64("nvme_wait_time", "s", "NVMe offload: time the update waited for them (the rest was hidden)")
      .col_f64("loss_scale", "1", "the loss scale of the step's backward pass (fp16's dynamic scale; 1 otherwise)")
      .col_i64("skipped", "1", "1 if the gradients overflowed (fp16) and the update was skipped")
      .col_f64("moe_aux_loss", "nats/token",
               "MoE: this rank's auxiliary losses, summed over its MoE blocks, mean over micro-batches (in loss)")
      .col_f64("load_imbalance", "1", "MoE: max over this rank's MoE blocks of max / mean assignments per expert")
      .col_f64("drop_rate", "1", "MoE: share of this rank's assignments dropped past an expert's capacity");
  const std::vector<std::string> axes = layout.axis_names();
  for (const std::string& axis : axes)
    st.col_f64(fmt::format("exposed_comm_{}", axis), "s",
               fmt::format("time this rank was blocked in {} communication during the step (not hidden by compute)",
                           axis));
  for (const RankRows& rr : ranks)
    for (const auto& r : *rr.steps) {
      std::vector<report::Cell> row{
          std::int64_t(rr.rank), std::int64_t(r.step), std::int64_t(r.warmup), r.loss, r.lr, r.grad_norm,
          std::int64_t(r.clipped), r.step_time, r.rank_step_time, r.tokens, r.tokens_per_s, r.model_flops,
          r.flops_per_s, r.mfu, r.hardware_flops, r.hfu, r.offload.bytes_to_host, r.offload.bytes_to_device,
          r.offload.copy_time, r.offload.copy_wait_time, r.offload.update_time, r.offload.nvme_bytes_read,
          r.offload.nvme_bytes_written, r.offload.nvme_io_time, r.offload.nvme_wait_time, r.loss_scale,
          std::int64_t(r.skipped), r.moe_aux, r.load_imbalance, r.drop_rate};
      STRATA_CHECK(r.exposed_comm.size() == axes.size(), "a step record of {} axes for a layout of {}",
                   r.exposed_comm.size(), axes.size());
      row.insert(row.end(), r.exposed_comm.begin(), r.exposed_comm.end());
      st.add_row(row);
    }
  out.push_back(std::move(st));

  report::Table ex("experts", "MoE routing per step, rank, block and expert (empty for a dense model)");
  ex.col_i64("rank", "1", "MPI rank in the world communicator")
      .col_i64("step", "1", "0-based optimizer step")
      .col_i64("layer", "1", "the MoE block (1..L, as in /timeline)")
      .col_i64("expert", "1", "expert index in the block")
      .col_i64("tokens_routed", "tokens", "assignments of tokens to the expert over the step (k per token)")
      .col_i64("tokens_dropped", "tokens", "of those, past the expert's capacity")
      .col_f64("prob_mass", "1", "router probability of the expert summed over the step's tokens");
  for (const RankRows& rr : ranks)
    if (rr.experts != nullptr)
    for (const auto& e : *rr.experts)
    ex.add_row({std::int64_t(rr.rank), std::int64_t(e.step), std::int64_t(e.layer + 1), std::int64_t(e.expert),
                e.routed, e.dropped, e.prob_mass});
  out.push_back(std::move(ex));
  out.push_back(memory_table(memory));

  report::Table tl("timeline", "compute spans per rank: forward and backward per layer, optimizer per step");
  tl.col_i64("rank", "1", "MPI rank in the world communicator")
      .col_i64("step", "1", "0-based optimizer step")
      .col_i64("micro_batch", "1", "micro-batch within the step (0 for the optimizer)")
      .col_i64("chunk", "1", "model chunk of this pipeline rank (interleaved schedule; else 0)")
      .col_i64("layer", "1", "0 embedding, 1..L transformer blocks, L+1 final norm, head and loss, -1 optimizer")
      .col_str("phase", 16, "",
               "forward, backward (input and weight gradients together), backward_input, backward_weight "
               "(a zero-bubble schedule's two halves) or optimizer")
      .col_f64("start", "s", "start, seconds since the run's clock origin")
      .col_f64("end", "s", "end, seconds since the run's clock origin");
  for (const RankRows& rr : ranks)
    if (rr.timeline != nullptr)
    for (const auto& s : rr.timeline->spans())
      tl.add_row({std::int64_t(rr.rank), std::int64_t(s.step), std::int64_t(s.micro_batch), std::int64_t(s.chunk),
                  std::int64_t(s.layer),
                  std::string(prof::phase_name(s.phase)), s.start, s.end});
  out.push_back(std::move(tl));

  report::Table cm("comm", "one row per communication call on this rank");
  cm.col_i64("rank", "1", "MPI rank in the world communicator")
      .col_i64("step", "1", "0-based optimizer step")
      .col_str("op", 16, "", "all_reduce, reduce_scatter, all_gather, broadcast, all_to_all(v), send, recv, barrier")
      .col_str("axis", 16, "", "mesh axis of the communicator (docs/report-schema.md)")
      .col_i64("group_size", "1", "ranks in the communicator the call ran on")
      .col_i64("bytes", "B",
               "all_reduce: the buffer; reduce_scatter: the whole input; all_gather: the whole output; "
               "others: what this rank sends")
      .col_i64("nonblocking", "1", "1 for a non-blocking call (start when issued, end when seen complete)")
      .col_f64("start", "s", "when the call was issued, seconds since the run's clock origin")
      .col_f64("end", "s", "when the call was known complete, seconds since the run's clock origin")
      .col_f64("wait", "s", "time this rank was blocked by the call: all of it if blocking, else inside wait/test")
      .col_f64("peer_wait", "s",
               "recv: the part of wait before the peer's message arrived (the rest is the transfer); else 0")
      .col_f64("transfer_start", "s",
               "the transfer's start: a GPU operation's own (stream events); a host call's issue (a recv's message "
               "arrival); a non-blocking MPI call's end - its time inside MPI (estimated: see docs/report-schema.md)")
      .col_f64("transfer_end", "s", "the transfer's end: a GPU operation's own; on the host, end")
      .col_i64("peer", "1", "send and recv: the other rank, as its rank in the axis's group; -1 for collectives")
      .col_i64("tag", "1", "send and recv: the message tag (a send and its receive share peer pair and tag); -1 else");
  for (const RankRows& rr : ranks)
    if (rr.comm != nullptr)
    for (const auto& r : rr.comm->records())
      cm.add_row({std::int64_t(rr.rank), std::int64_t(r.step), std::string(r.op), std::string(r.axis),
                  std::int64_t(r.group_size), r.bytes, std::int64_t(r.nonblocking), r.start, r.end, r.wait,
                  r.peer_wait, r.transfer_start, r.transfer_end, std::int64_t(r.peer), std::int64_t(r.tag)});
  out.push_back(std::move(cm));
  return out;
}

void write_tables(report::H5File& f, const mesh::Layout& layout, const std::vector<RankRows>& ranks,
                  const std::vector<MemoryRecord>& memory) {
  f.write_table(ranks_table(layout, ranks));
  for (const report::Table& t : step_tables(layout, ranks, memory)) f.write_table(t);
}

std::map<int, StepSpans> spans_by_step(const prof::Timeline& timeline) {
  std::map<int, StepSpans> out;
  for (const auto& s : timeline.spans())
    if (s.step >= 0) (s.phase == prof::Phase::optimizer ? out[s.step].optimizer : out[s.step].busy) += s.end - s.start;
  return out;
}

void BubbleSamples::add(const prof::Timeline& timeline, const std::vector<StepRecord>& steps) {
  // The pipeline's part of a step is all but the optimizer span (gradient
  // synchronisation, norm, clipping, AdamW), which every schedule has alike
  // and the theory leaves out; its idle time is that part minus the compute.
  // Keyed by the global step: a resumed run's records start past 0.
  std::map<int, StepSpans> by_step = spans_by_step(timeline);
  for (const auto& r : steps) {
    if (r.warmup) continue;
    const StepSpans& s = by_step[r.step];
    const double pipe = s.pipeline(r.step_time);
    if (pipe <= 0) continue;
    const double idle = s.idle(r.step_time);
    over_step.push_back(idle / pipe);
    if (s.busy > 0) over_compute.push_back(idle / s.busy);
  }
}

Bubble measure_bubble(const BubbleSamples& samples, int pp_rank, int stages, int micro_batches, int virtual_stages,
                      const strategies::pp::ScheduleInfo& schedule) {
  Bubble b{pp_rank, stages, micro_batches, virtual_stages, schedule.name};
  b.theory = stages > 1 ? schedule.bubble({stages, micro_batches, virtual_stages}) : 0.0;
  b.idle_over_step = median(samples.over_step);
  b.idle_over_compute = median(samples.over_compute);
  return b;
}

Bubble measure_bubble(const prof::Timeline& timeline, const std::vector<StepRecord>& steps, int pp_rank, int stages,
                      int micro_batches, int virtual_stages, const strategies::pp::ScheduleInfo& schedule) {
  BubbleSamples samples;
  samples.add(timeline, steps);
  return measure_bubble(samples, pp_rank, stages, micro_batches, virtual_stages, schedule);
}

void write_pipeline_summary(report::H5File& f, const std::vector<std::pair<int, Bubble>>& per_rank) {
  report::Table t("summary/pipeline", "per rank: the measured pipeline bubble beside the schedule's");
  t.col_i64("rank", "1", "MPI rank in the world communicator")
      .col_i64("pp_rank", "1", "pipeline stage of the rank")
      .col_i64("stages", "1", "pipeline stages p")
      .col_i64("micro_batches", "1", "micro-batches per step m")
      .col_i64("virtual_stages", "1", "model chunks per rank v (interleaved, zb-v; else 1)")
      .col_str("schedule", 16, "", "pipeline schedule")
      .col_f64("bubble", "1",
               "median over measured steps of idle / pipeline time (pipeline time = step time - optimizer span; "
               "idle = pipeline time - forward and backward spans)")
      .col_f64("bubble_over_compute", "1", "median of idle / busy compute time")
      .col_f64("theory", "1",
               "the schedule's idle / step time with unit costs, its row's formula (strategies/pp/schedule.cpp): "
               "(p-1)/(m+p-1) gpipe and 1f1b, (p-1)/(v m+p-1) interleaved, (p-1)/(3m+p-1) zb-h1, 1 - 6m/T zb-v");
  for (const auto& [rank, b] : per_rank)
  t.add_row({std::int64_t(rank), std::int64_t(b.pp_rank), std::int64_t(b.stages), std::int64_t(b.micro_batches),
             std::int64_t(b.virtual_stages), b.schedule, b.idle_over_step, b.idle_over_compute, b.theory});
  f.write_table(t);
}

double CommAggregate::busbw() const { return algbw() * comm::busbw_factor(op, group_size); }

std::int64_t size_class(std::int64_t bytes) {
  std::int64_t c = bytes > 0 ? 1 : 0;
  while (c > 0 && c < bytes) c *= 2;
  return c;
}

std::vector<CommAggregate> aggregate_comm(const comm::CommLog& log, int first_step) {
  std::vector<CommAggregate> out;
  add_to_aggregates(out, log, first_step);
  return out;
}

void add_to_aggregates(std::vector<CommAggregate>& out, const comm::CommLog& log, int first_step) {
  for (const auto& r : log.records()) {
    if (r.step < first_step) continue;
    const std::int64_t sc = size_class(r.bytes);
    auto it = std::find_if(out.begin(), out.end(), [&](const CommAggregate& a) {
      return a.axis == r.axis && a.op == r.op && a.group_size == r.group_size && a.size_class == sc;
    });
    if (it == out.end()) {
      out.push_back({std::string(r.axis), std::string(r.op), r.group_size, sc});
      it = out.end() - 1;
    }
    it->count += 1;
    it->bytes += double(r.bytes);
    it->time += r.transfer();
    it->group_time = it->time;
    it->span += r.span();
    it->wait += r.wait;
    it->peer_wait += r.peer_wait;
  }
}

void take_group_transfer_times(std::vector<CommAggregate>& rows, const std::vector<std::string>& axes,
                               const std::function<MPI_Comm(std::string_view)>& comm_of) {
  for (const std::string& axis : axes) {
    const MPI_Comm c = comm_of(axis);
    if (c == MPI_COMM_NULL) continue;
    std::vector<CommAggregate*> mine;
    for (CommAggregate& a : rows)
      if (a.axis == axis && a.op != "send" && a.op != "recv") mine.push_back(&a);
    // The members issued the same collectives, so the same rows in the same
    // order; counted first, so that a mismatch cannot become a wrong pairing.
    int n[2] = {int(mine.size()), -int(mine.size())};
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, n, 2, MPI_INT, MPI_MAX, c));
    if (n[0] != -n[1] || n[0] == 0) continue;
    std::vector<double> t, least;
    for (const CommAggregate* a : mine) t.push_back(a->time);
    least = t;
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, t.data(), n[0], MPI_DOUBLE, MPI_MAX, c));
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, least.data(), n[0], MPI_DOUBLE, MPI_MIN, c));
    // The member that came last waited for no one: the least time is the
    // transfer, the rest of a member's its wait for the last.
    for (std::size_t i = 0; i < mine.size(); ++i) {
      mine[i]->group_time = t[i];
      mine[i]->group_wait = std::max(0.0, mine[i]->time - least[i]);
    }
  }
}

namespace {

// Every member's `mine` intersected, on every member of `c`: up a binomial
// tree to rank 0 (each message at most one member's list), then broadcast.
comm::Intervals intersect_over(comm::Intervals mine, MPI_Comm c) {
  int rank = 0, n = 1;
  STRATA_CHECK_MPI(MPI_Comm_rank(c, &rank));
  STRATA_CHECK_MPI(MPI_Comm_size(c, &n));
  for (int step = 1; step < n; step *= 2) {
    if (rank % (2 * step) == step) {
      std::int64_t size = std::int64_t(mine.size());
      STRATA_CHECK_MPI(MPI_Send(&size, 1, MPI_INT64_T, rank - step, 0, c));
      STRATA_CHECK_MPI(MPI_Send(mine.data(), int(2 * size), MPI_DOUBLE, rank - step, 1, c));
      break;
    }
    if (rank % (2 * step) == 0 && rank + step < n) {
      std::int64_t size = 0;
      STRATA_CHECK_MPI(MPI_Recv(&size, 1, MPI_INT64_T, rank + step, 0, c, MPI_STATUS_IGNORE));
      comm::Intervals theirs(static_cast<std::size_t>(size));
      STRATA_CHECK_MPI(MPI_Recv(theirs.data(), int(2 * size), MPI_DOUBLE, rank + step, 1, c, MPI_STATUS_IGNORE));
      mine = comm::intersect(mine, theirs);
    }
  }
  std::int64_t size = std::int64_t(mine.size());
  STRATA_CHECK_MPI(MPI_Bcast(&size, 1, MPI_INT64_T, 0, c));
  mine.resize(std::size_t(size));
  STRATA_CHECK_MPI(MPI_Bcast(mine.data(), int(2 * size), MPI_DOUBLE, 0, c));
  return mine;
}

bool is_collective(const comm::CommRecord& r) { return r.op != "send" && r.op != "recv"; }

}  // namespace

void share_progress_with_group(comm::CommLog& log, const std::vector<std::string>& axes,
                               const std::function<MPI_Comm(std::string_view)>& comm_of) {
  const comm::HostProgress& progress = log.progress();
  const comm::Intervals inside = comm::merged(progress.inside);
  for (const std::string& axis : axes) {
    const MPI_Comm c = comm_of(axis);
    if (c == MPI_COMM_NULL) continue;
    std::map<std::size_t, double> busy;  // record -> its refined share
    for (std::size_t i = 0; i < log.records().size(); ++i) {
      const comm::CommRecord& r = log.records()[i];
      if (r.axis == axis && r.host_estimate && is_collective(r) && r.group_size > 1) busy[i] = 0;
    }
    // The members have the same collectives; agreed all the same, so that
    // none waits in the exchange below for a member that skips it.
    int any = busy.empty() ? 0 : 1;
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, c));
    if (any == 0) continue;
    // Each piece lies inside one of this rank's own intervals, so the time
    // every member was inside MPI, within it, is the time all the others were.
    const comm::Intervals together = intersect_over(inside, c);
    for (const comm::HostProgress::Piece& p : progress.pieces)
      if (const auto it = busy.find(p.record); it != busy.end())
        it->second += p.share * comm::covered(together, p.t0, p.t1);
    for (const auto& [i, b] : busy) {
      comm::CommRecord& r = log.at(i);
      r.transfer_start = std::max(r.start, r.transfer_end - b);
    }
  }
}

void write_comm_summary(report::H5File& f, const std::vector<std::pair<int, std::vector<CommAggregate>>>& per_rank) {
  report::Table t("summary/comm",
                  "per rank, axis, op and message-size class over the measured steps (warm-up excluded)");
  t.col_i64("rank", "1", "MPI rank in the world communicator")
      .col_str("axis", 16, "", "mesh axis")
      .col_str("op", 16, "", "operation")
      .col_i64("group_size", "1", "ranks in the group (n of the bus-bandwidth factor)")
      .col_i64("size_class", "B",
               "the row's calls moved (size_class / 2, size_class] bytes each (a power of two; 0: empty calls), so "
               "scalars and gradient buckets never share a row")
      .col_i64("count", "1", "calls")
      .col_f64("bytes", "B", "bytes summed over calls (per-call convention of /comm)")
      .col_f64("time", "s", "summed transfer time, transfer_end - transfer_start of /comm")
      .col_f64("group_time", "s",
               "collectives: the largest time of the group's members (its transfer is done when its slowest "
               "member's part is); send and recv: time")
      .col_f64("span", "s", "summed end - start: from issue to seen complete (a non-blocking call's spans its overlap)")
      .col_f64("wait", "s", "summed time blocked (exposed communication)")
      .col_f64("peer_wait", "s", "recv: summed time waiting for the peer's message (the rest of wait is transfer)")
      .col_f64("group_wait", "s",
               "collectives: the part of time spent waiting for the group's last member (this rank's time less the "
               "least of its members'; simulated: blocked beyond the transfer); else 0")
      .col_f64("hidden_fraction", "1", "1 - wait / span: share of the calls' spans this rank was not blocked in")
      .col_f64("algbw", "B/s", "bytes / group_time (the transfer time, never the span)")
      .col_f64("busbw", "B/s", "algbw x nccl-tests factor: all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n");
  for (const auto& [rank, aggs] : per_rank)
  for (const auto& a : aggs)
    t.add_row({std::int64_t(rank), a.axis, a.op, std::int64_t(a.group_size), a.size_class, a.count, a.bytes, a.time,
               a.group_time, a.span, a.wait, a.peer_wait, a.group_wait, a.hidden_fraction(), a.algbw(), a.busbw()});
  f.write_table(t);
}

void write_host_memory_summary(report::H5File& f, const std::vector<HostMemory>& per_rank) {
  report::Table t("summary/host_memory", "per rank: the host memory of its process and of its records");
  t.col_i64("rank", "1", "MPI rank in the world communicator")
      .col_i64("peak_rss", "B", "the process at its largest resident set (getrusage) when the report was written")
      .col_i64("records_bytes", "B",
               "the most the rank's per-step records held at once: the window's room and the progress account of its "
               "non-blocking calls, and 32 B a measured step for the summary's medians");
  for (const HostMemory& h : per_rank) t.add_row({std::int64_t(h.rank), h.peak_rss, h.records_bytes});
  f.write_table(t);
}

void write_summary(report::H5File& f, const Summary& s, const Provenance& p) {
  const std::string g = "/summary";
  f.create_group(g);
  f.write_scalar(g, "measured_steps", double(s.measured_steps), "1", "steps after warm-up that the figures use");
  f.write_scalar(g, "tokens_per_s", s.tokens_per_s, "tokens/s", "median tokens/s over measured steps");
  f.write_scalar(g, "tokens_per_s_per_device", s.tokens_per_s / std::max(1, p.world_size), "tokens/s",
                 "tokens_per_s / world_size: throughput per device (a rank)");
  f.write_scalar(g, "step_time", s.step_time, "s",
                 "median over measured steps of the step's time (the slowest rank's: /steps step_time)");
  f.write_scalar(g, "model_flops_per_step", s.model_flops_per_step, "FLOP",
                 "model FLOPs per step, counted from the layers (Megatron's formula for a dense GPT)");
  f.write_scalar(g, "flops_per_s", s.flops_per_s, "FLOP/s", "model_flops_per_step / step_time");
  f.write_scalar(g, "peak_flops", p.peak_flops, "FLOP/s", "peak that MFU is measured against: the sum of every rank's peak (peak_source)");
  f.write_scalar(g, "peak_flops_per_device", p.peak_flops_per_device, "FLOP/s",
                 "one device's (rank's) peak: rank 0's, from peak_source");
  f.write_scalar(g, "peak_source", p.peak_source,
                 "where the per-device peak comes from: backend.peak_tflops, backend.machine's description, or a "
                 "GEMM measured once per host and cached (cached: PATH, or measured: ... (cached to PATH))");
  f.write_scalar(g, "mfu", s.mfu, "1", "model FLOPs utilisation: flops_per_s / peak_flops");
  f.write_scalar(g, "hardware_flops_per_step", s.hardware_flops_per_step, "FLOP",
                 "FLOPs executed per step: the model's plus the forward work activation recomputation repeats");
  f.write_scalar(g, "hfu", s.hfu, "1", "hardware FLOPs utilisation: hardware_flops_per_step / step_time / peak_flops");
  f.write_scalar(g, "initial_loss", s.initial_loss, "nats/token", "loss of step 0");
  f.write_scalar(g, "final_loss", s.final_loss, "nats/token", "loss of the last step");
  f.write_scalar(g, "precision", p.precision, "fp32, or the 16-bit format of mixed precision (bf16, fp16)");
  f.write_scalar(g, "skipped_steps", double(s.skipped_steps), "1",
                 "steps whose update was skipped because fp16 gradients overflowed");
  f.write_scalar(g, "parameters", double(p.parameters), "1", "number of model parameters");
  f.write_scalar(g, "layout", p.layout, "process mesh: pp x dp x tp");
  f.write_scalar(g, "strategy", p.strategy, "state strategy: dp, zero1, zero2 or zero3");
  f.write_scalar(g, "padding_elements", double(p.padding_elements), "1",
                 "elements added so that ZeRO shards are equal (per dp group; 0 for dp)");
  for (int c = 0; c < core::kNumMemCategories; ++c) {
    const auto cat = core::category_name(core::MemCategory(c));
    f.write_scalar(g, std::string("peak_bytes_") + cat, double(s.peak_bytes[c]), "B",
                   std::string("largest ") + cat + " bytes held on any step (on peak_bytes_rank)");
  }
  f.write_scalar(g, "peak_bytes_total", double(s.peak_total), "B",
                 "sum of the per-category peaks of peak_bytes_rank: the largest over ranks");
  f.write_scalar(g, "peak_bytes_rank", double(s.peak_rank), "1",
                 "the rank whose peak_bytes_total is the largest (the lowest of equals); peak_bytes_* are its");
}

}  // namespace strata::train
