#include "src/train/records.hpp"

#include <algorithm>

#include "kernels/foundation/clock.hpp"
#include "kernels/kernels.hpp"
#include "models/model.hpp"
#include "src/train/memory_figures.hpp"

namespace strata::train {

RunRecords::RunRecords(const plan::Plan& cfg, const mesh::Mesh& mesh, const prof::Timeline& timeline,
                       comm::CommLog& log, double job_peak)
    : cfg_(cfg), mesh_(mesh), timeline_(timeline), log_(log), job_peak_(job_peak),
      axes_(mesh.layout().axis_names()) {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  host_ = name;
}

StepRecord& RunRecords::keep(StepRecord r, const Trainer& trainer, const core::MemoryTracker& tracker,
                             std::size_t first_call) {
  experts.insert(experts.end(), trainer.expert_records().begin(), trainer.expert_records().end());
  for (const auto& m :
       memory_records(mesh_.rank(), r.step, rank_memory(tracker, trainer.host_tracker(), trainer.nvme_file()), cfg_))
    memory.push_back(m);
  r.exposed_comm.assign(axes_.size(), 0.0);
  for (std::size_t i = first_call; i < log_.records().size(); ++i) {
    const comm::CommRecord& c = log_.records()[i];
    const auto a = std::find(axes_.begin(), axes_.end(), c.axis);
    if (a != axes_.end()) r.exposed_comm[std::size_t(a - axes_.begin())] += c.wait;
  }
  return steps.emplace_back(r);
}

void RunRecords::write(report::H5File& to, const char* status, MPI_Comm together, const Provenance& prov,
                       double started) {
  const models::Family& family = models::family(cfg_);
  summary = summarise(steps, memory, family.model_flops(cfg_, cfg_.data.global_batch),
                      family.hardware_flops(cfg_, cfg_.data.global_batch), job_peak_);
  take_largest_rank_memory(summary, together);
  const auto axis_comm = [&](std::string_view axis) { return mesh_.mpi_comm(axis); };
  const bool all_completed = std::string_view(status) != "failed";
  if (all_completed) share_progress_with_group(log_, axes_, axis_comm);
  comm = aggregate_comm(log_, cfg_.run.warmup_steps);
  if (all_completed) take_group_transfer_times(comm, axes_, axis_comm);
  const int stages = mesh_.layout().size("pp");
  bubble = measure_bubble(timeline_, steps, mesh_.coord("pp"), stages, cfg_.micro_batches(),
                          stages > 1 ? cfg_.parallel.virtual_stages : 1, *cfg_.parallel.schedule);
  write_tables(to, mesh_.layout(),
               {{mesh_.rank(), &steps, &experts, cfg_.run.profile ? &timeline_ : nullptr, &log_, host_}}, memory);
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
