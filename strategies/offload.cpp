// The state seam's offload row: where the optimizer state lives, whatever
// the state strategy (dp or ZeRO, every stage): on the device, in a host
// arena (ZeRO-Offload), or in a file on NVMe (ZeRO-Infinity), with ZeRO-3's
// parameter shard there too (offload.params). The mechanism is AdamW's
// (models/optimizer.hpp, models/nvme.hpp); this row owns its deck keys,
// their checks, and opens what the optimizers take.
#include <fmt/format.h>

#include "plan/plan.hpp"
#include "strategies/registry.hpp"

namespace strata::strategies {

namespace {

using plan::key, plan::Plan, plan::ParallelSection, plan::OffloadSection, plan::Offload;

void check_offload(const Plan& c, PlanChecks& checks) {
  if (c.parallel.offload == Offload::nvme && c.offload.path.empty())
    checks.error({"parallel.offload", "offload.path"},
                 fmt::format("{} needs offload.path, the directory each rank's optimizer file goes in (on the NVMe)",
                             checks.show("parallel.offload")));
  if (c.offload.params && (c.parallel.offload != Offload::nvme || c.parallel.zero != 3))
    checks.error({"offload.params", "parallel.offload", "parallel.zero"},
                 fmt::format("offload.params = true needs parallel.offload = \"nvme\" and parallel.zero = 3 ({}, {}): "
                             "only ZeRO-3 holds just a parameter shard to offload",
                             checks.show("parallel.offload"), checks.show("parallel.zero")));
}

std::vector<std::string> offload_choices(const Space&, const Plan&) {
  return {"none", "host"};
}

}  // namespace

const Row& offload_row() {
  static const Row row{
      "offload",
      "optimizer state on the host (ZeRO-Offload) or on NVMe (ZeRO-Infinity): AdamW runs on the host on copies of "
      "the rank's gradients and parameters",
      {key<&Plan::parallel, &ParallelSection::offload>("parallel", "offload", "where optimizer state is offloaded"),
       key<&Plan::offload, &OffloadSection::path>(
           "offload", "path", "parallel.offload = \"nvme\": the directory of each rank's optimizer file (on the NVMe)"),
       key<&Plan::offload, &OffloadSection::chunk_mb>(
           "offload", "chunk_mb", "parallel.offload = \"nvme\": MiB of each state tensor per streamed chunk")
           .above(0),
       key<&Plan::offload, &OffloadSection::params>(
           "offload", "params", "with parallel.offload = \"nvme\" and zero = 3: the parameter shard in the file too")},
      nullptr,
      check_offload,
      "host: the optimizer's 8 bytes per element (mixed precision 12, with the master weights) move to the host "
      "arena with 4 + 4 (2 + 2) of staging; nvme: those in the file, two chunk buffers in the arena; the device "
      "sends 8 (2) and receives 4 (2) bytes per element per step",
      nullptr,
      {{200, "parallel.offload", offload_choices, true, "offload", "none"}}};
  return row;
}

OffloadSetup open_offload(const Plan& p, core::MemoryTracker& host, models::OffloadStats* stats) {
  OffloadSetup s;
  if (p.parallel.offload == Offload::host) s.offload = {&host, stats};
  if (p.parallel.offload == Offload::nvme) {
    s.file = std::make_unique<models::NvmeFile>(p.offload.path, host, models::nvme_chunk_elements(p.offload.chunk_mb),
                                                p.backend.precision == core::Precision::fp32 ? 2 : 3);
    s.offload = {&host, stats, s.file.get(), p.offload.params};
  }
  return s;
}

}  // namespace strata::strategies
