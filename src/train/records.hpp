// One rank's records of a run, kept step by step, and how they become its
// report: every per-rank table (/ranks, /steps, /experts, /memory,
// /timeline, /comm), the communication and pipeline summaries and the
// headline figures (src/train/run_report.hpp's writers).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

#include "kernels/foundation/memory.hpp"
#include "kernels/foundation/timeline.hpp"
#include "plan/plan.hpp"
#include "src/comm/comm_log.hpp"
#include "src/mesh/mesh.hpp"
#include "src/report/h5file.hpp"
#include "src/train/run_report.hpp"
#include "src/train/trainer.hpp"

namespace strata::train {

class RunRecords {
 public:
  // The records of this rank of a run of `cfg` on `mesh`, whose spans go to
  // `timeline` and calls to `log`; MFU against `job_peak` FLOP/s.
  RunRecords(const plan::Plan& cfg, const mesh::Mesh& mesh, const prof::Timeline& timeline, comm::CommLog& log,
             double job_peak);

  // Keeps a step's record with its exposed communication per axis (the
  // log's records from `first_call` on), the routing the trainer recorded
  // and the memory the tracker held.
  StepRecord& keep(StepRecord r, const Trainer& trainer, const core::MemoryTracker& tracker, std::size_t first_call);

  // Everything into `to` with `status`: the run's report, every rank
  // together (`together` the run's communicator), or one failing rank's own
  // (MPI_COMM_SELF). The transfers of collectives are refined across their
  // groups only when every rank completed them (not a failed run's).
  void write(report::H5File& to, const char* status, MPI_Comm together, const Provenance& prov, double started);

  std::vector<StepRecord> steps;
  std::vector<ExpertRecord> experts;  // MoE routing, every step's
  std::vector<MemoryRecord> memory;
  // The headline figures, computed by write() from the records.
  Summary summary;
  std::vector<CommAggregate> comm;
  Bubble bubble;

 private:
  const plan::Plan& cfg_;
  const mesh::Mesh& mesh_;
  const prof::Timeline& timeline_;
  comm::CommLog& log_;
  double job_peak_;
  std::vector<std::string> axes_;
  std::string host_;
};

}  // namespace strata::train
