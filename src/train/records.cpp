#include "src/train/records.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>

#include "kernels/foundation/clock.hpp"
#include "kernels/foundation/error.hpp"
#include "kernels/kernels.hpp"
#include "models/model.hpp"
#include "src/train/memory_figures.hpp"

namespace strata::train {

RecordWindow record_window(const plan::Plan& cfg, std::size_t units, int micro_batches) {
  RecordWindow w;
  const std::size_t mb = std::size_t(std::max(micro_batches, 1));
  const std::size_t layers = std::size_t(cfg.model.layers);
  w.comm = 3 * units * mb + units + 64;
  w.spans = cfg.run.profile ? mb * 3 * (layers + 2) + 1 : 0;
  const std::size_t memory = std::size_t(core::kNumPools) * core::kNumMemCategories;
  const std::size_t experts = cfg.model.moe_experts > 0 ? layers * std::size_t(cfg.model.moe_experts) : 0;
  const std::size_t axes = 8;  // a step's exposed communication per axis, at most
  w.bytes_per_step = double(w.comm * sizeof(comm::CommRecord) + w.spans * sizeof(prof::Span) + sizeof(StepRecord) +
                            axes * sizeof(double) + memory * sizeof(MemoryRecord) + experts * sizeof(ExpertRecord));
  const double fit = std::floor(kRecordWindowBytes / w.bytes_per_step);
  w.steps = cfg.run.flush_every > 0 ? cfg.run.flush_every : int(std::clamp(fit, 1.0, double(cfg.run.steps)));
  w.steps = std::min(w.steps, cfg.run.steps);
  w.bytes = double(w.steps) * w.bytes_per_step;
  return w;
}

void check_record_window(const plan::Plan& cfg) {
  if (cfg.run.flush_every == 0) return;
  const RecordWindow w = record_window(cfg, std::size_t(cfg.model.layers) + 2, std::max(1, cfg.micro_batches()));
  if (w.bytes <= kMaxRecordWindowBytes) return;
  core::input_error("run.flush_every = {}: a window of {} step(s) of records takes up to {} per rank on the host, more "
                    "than the {} allowed; at most {} here (0: a window of {})",
                    cfg.run.flush_every, w.steps, core::format_bytes(w.bytes), core::format_bytes(kMaxRecordWindowBytes),
                    std::int64_t(kMaxRecordWindowBytes / w.bytes_per_step), core::format_bytes(kRecordWindowBytes));
}

RunRecords::RunRecords(const plan::Plan& cfg, const mesh::Mesh& mesh, prof::Timeline& timeline, comm::CommLog& log,
                       double job_peak)
    : cfg_(cfg), mesh_(mesh), timeline_(timeline), log_(log), job_peak_(job_peak),
      axes_(mesh.layout().axis_names()) {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  host_ = name;
}

void RunRecords::prepare(const Trainer& trainer) {
  window_ = record_window(cfg_, trainer.units().size(), trainer.micro_batches());
  const std::size_t k = std::size_t(window_.steps);
  log_.reserve(k * window_.comm);
  if (timeline_.enabled()) timeline_.reserve(k * window_.spans);
  steps_.reserve(k);
  memory_.reserve(k * std::size_t(core::kNumPools) * core::kNumMemCategories);
  // The whole run's samples grow as windows are folded in, outside the
  // measured steps; nothing is reserved for them (a run of 10^8 steps would
  // ask for gigabytes of address space up front).
}

StepRecord& RunRecords::keep(StepRecord r, const Trainer& trainer, const core::MemoryTracker& tracker,
                             std::size_t first_call) {
  experts_.insert(experts_.end(), trainer.expert_records().begin(), trainer.expert_records().end());
  const RankMemory held = rank_memory(tracker, trainer.host_tracker(), trainer.nvme_file());
  last_device_peak_ = held[core::Pool::device].total_peak;
  for (const auto& m : memory_records(mesh_.rank(), r.step, held, cfg_)) memory_.push_back(m);
  r.exposed_comm.assign(axes_.size(), 0.0);
  for (std::size_t i = first_call; i < log_.records().size(); ++i) {
    const comm::CommRecord& c = log_.records()[i];
    const auto a = std::find(axes_.begin(), axes_.end(), c.axis);
    if (a != axes_.end()) r.exposed_comm[std::size_t(a - axes_.begin())] += c.wait;
  }
  return steps_.emplace_back(r);
}

std::size_t RunRecords::held() const {
  const comm::HostProgress& p = log_.progress();
  // The window's room (reserved, so touched); of the whole run's samples,
  // what is taken (pages past it, left by a vector's growth, are untouched).
  return steps_.capacity() * (sizeof(StepRecord) + axes_.size() * sizeof(double)) +
         experts_.capacity() * sizeof(ExpertRecord) + memory_.capacity() * sizeof(MemoryRecord) +
         log_.records().capacity() * sizeof(comm::CommRecord) + p.inside.capacity() * sizeof(p.inside[0]) +
         p.pieces.capacity() * sizeof(p.pieces[0]) + timeline_.spans().capacity() * sizeof(prof::Span) +
         (running_.times.size() + running_.rates.size() + bubble_samples_.over_step.size() +
          bubble_samples_.over_compute.size()) * sizeof(double) +
         comm_.capacity() * sizeof(CommAggregate);
}

void RunRecords::flush(report::H5File& to, bool all_completed) {
  most_held_ = std::max(most_held_, held());
  const auto axis_comm = [&](std::string_view axis) { return mesh_.mpi_comm(axis); };
  if (all_completed) share_progress_with_group(log_, axes_, axis_comm);
  // Written first: a failure while writing leaves the window whole for the
  // report that says so.
  for (const report::Table& t :
       step_tables(mesh_.layout(),
                   {{mesh_.rank(), &steps_, &experts_, cfg_.run.profile ? &timeline_ : nullptr, &log_, host_}},
                   memory_))
    to.append_table(t);
  // The file readable as of this window: a reader can follow the run, and
  // a rank failing alone later keeps every rank's rows up to here.
  to.flush();
  flushed_to_ = &to;
  if (!steps_.empty()) next_step_ = steps_.back().step + 1;
  add_to_aggregates(comm_, log_, cfg_.run.warmup_steps);
  bubble_samples_.add(timeline_, steps_);
  for (const StepRecord& s : steps_) running_.add(s);
  for (const MemoryRecord& m : memory_) running_.add(m);
  steps_.clear();
  experts_.clear();
  memory_.clear();
  log_.clear();
  timeline_.clear();
}

void RunRecords::write(report::H5File& to, const char* status, MPI_Comm together, const Provenance& prov,
                       double started) {
  const bool all_completed = std::string_view(status) != "failed";
  if (flushed_to_ != nullptr && flushed_to_ != &to)
    to.set_attr("/", "rows_from_step", std::int64_t(steps_.empty() ? next_step_ : steps_.front().step));
  flush(to, all_completed);
  const models::Family& family = models::family(cfg_);
  summary = running_.finish(family.model_flops(cfg_, cfg_.data.global_batch),
                            family.hardware_flops(cfg_, cfg_.data.global_batch), job_peak_);
  take_largest_rank_memory(summary, together);
  comm = comm_;
  if (all_completed) take_group_transfer_times(comm, axes_, [&](std::string_view axis) { return mesh_.mpi_comm(axis); });
  const int stages = mesh_.layout().size("pp");
  bubble = measure_bubble(bubble_samples_, mesh_.coord("pp"), stages, cfg_.micro_batches(),
                          stages > 1 ? cfg_.parallel.virtual_stages : 1, *cfg_.parallel.schedule);
  struct rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  to.write_table(ranks_table(mesh_.layout(), {{mesh_.rank(), nullptr, nullptr, nullptr, nullptr, host_}}));
  // Linux gives ru_maxrss in KiB.
  write_host_memory_summary(to, {{mesh_.rank(), std::int64_t(usage.ru_maxrss) * 1024, std::int64_t(most_held_)}});
  write_comm_summary(to, {{mesh_.rank(), comm}});
  write_pipeline_summary(to, {{mesh_.rank(), bubble}});
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
}

}  // namespace strata::train
