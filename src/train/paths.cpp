#include "src/train/paths.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "kernels/foundation/error.hpp"
#include "src/comm/mpi_check.hpp"
#include "src/report/claim.hpp"
#include "src/report/output_path.hpp"
#include "src/sim/machine.hpp"

namespace fs = std::filesystem;

namespace strata::train {

namespace {

// Rank 0's problem (empty: none) becomes every rank's input error.
void agree_input(MPI_Comm comm, const std::string& problem_on_root) {
  const std::string p = comm::broadcast_string(problem_on_root, comm);
  if (!p.empty()) core::input_error("{}", p);
}

// Why a directory a run writes into cannot be used or made, or "".
std::string directory_problem(const std::string& dir) {
  std::error_code ec;
  const fs::path c(dir);
  if (fs::exists(c, ec) && !fs::is_directory(c, ec)) return "exists and is not a directory";
  if (fs::is_directory(c, ec) && ::access(c.c_str(), W_OK | X_OK) != 0)
    return fmt::format("not writable: {}", std::strerror(errno));
  if (!fs::exists(c, ec)) return report::writable_place(c.parent_path());
  return "";
}

}  // namespace

std::vector<report::Input> run_inputs(const deck::Deck& deck, const std::string& resume, const std::string& machine) {
  const plan::Plan& cfg = deck.config;
  std::vector<report::Input> in{{deck.path, "the deck"}};
  if (cfg.data.source == plan::DataSource::text) in.push_back({cfg.data.path, "data.path, the text the run reads"});
  if (!cfg.backend.machine.empty())
    if (const std::string m = sim::machine_path(cfg.backend.machine); !m.empty())
      in.push_back({m, "backend.machine's description"});
  if (!resume.empty()) in.push_back({resume, "the checkpoint resumed (--resume)"});
  if (!machine.empty()) in.push_back({machine, "the machine description (--machine)"});
  return in;
}

std::string check_output_paths(MPI_Comm comm, const std::string& named, const std::string& fallback, bool replace,
                               const std::string& checkpoint_dir, bool checkpoints,
                               const std::vector<report::Input>& inputs) {
  int rank = 0;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  std::string problem;
  report::ReportPath report;
  if (rank == 0) {
    std::vector<report::Input> taken = inputs;
    if (checkpoints) taken.push_back({checkpoint_dir, "the checkpoint directory this run writes", true});
    report = report::choose_report_path(named, fallback, replace, "report", taken);
    if (!report.problem.empty()) problem = fmt::format("report path {}: {}", report.path, report.problem);
    if (problem.empty() && checkpoints) {
      if (const std::string why = directory_problem(checkpoint_dir); !why.empty())
        problem = fmt::format("checkpoint directory {}: {}", checkpoint_dir, why);
      // (An input file in its place is "not a directory" above; the
      // directory that holds the resumed checkpoints may be this one.)
      for (const report::Input& in : inputs)
        if (problem.empty() && report::inside(checkpoint_dir, in.path))
          problem = fmt::format("checkpoint directory {}: lies inside {} ({}); give a directory of its own",
                                checkpoint_dir, in.what, in.path);
    }
  }
  agree_input(comm, problem);
  if (rank == 0 && !report.note.empty()) fmt::print("{}\n", report.note);
  return comm::broadcast_string(report.path, comm);
}

void check_offload_dir(MPI_Comm comm, const std::string& dir) {
  int rank = 0;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  std::string problem;
  if (rank == 0)
    if (const std::string why = directory_problem(dir); !why.empty())
      problem = fmt::format("offload.path {}: {} (each rank's optimizer file goes there)", dir, why);
  agree_input(comm, problem);
}

PathClaim::PathClaim(MPI_Comm comm, const std::string& path, const char* what) : lock_(path + ".lock") {
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank_));
  std::string problem, said;
  if (rank_ == 0) problem = report::take_claim(path, lock_, what, &content_, &said);
  agree_input(comm, problem);
  if (rank_ == 0 && !said.empty()) fmt::print("{}", said);
  content_ = comm::broadcast_string(content_, comm);
  held_ = true;
}

void PathClaim::release() {
  if (!held_) return;
  held_ = false;
  report::release_claim(lock_, content_);
}

}  // namespace strata::train
