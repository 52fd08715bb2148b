// The paths a run writes: checked before step 1 (bad input, exit 2, rather
// than a failure after the whole run), and claimed for the run's lifetime so
// that two runs never write one report or one checkpoint directory.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "src/deck/deck.hpp"
#include "src/report/output_path.hpp"

namespace strata::train {

// What a command reads: the deck, data.path, backend.machine's description,
// the checkpoint it resumes (--resume, may be "") and the machine
// description of simulate and plan (--machine, may be "").
std::vector<report::Input> run_inputs(const deck::Deck& deck, const std::string& resume,
                                      const std::string& machine = "");

// Rank 0 checks, every rank takes the verdict, and the report path it
// returns: the one named (--output or run.output), which must not hold a
// file unless `replace` (--force), else `fallback` or the first free name
// beside it (report::choose_report_path; said on stdout). The report path
// is not a directory, not one of `inputs` nor inside one, not inside the
// checkpoint directory the run writes, and its directory can be written (or
// made); the checkpoint directory (when `checkpoints` is set) is a directory
// or can be made, and not inside a checkpoint the run resumes. Input error
// naming the path and the problem.
std::string check_output_paths(MPI_Comm comm, const std::string& named, const std::string& fallback, bool replace,
                               const std::string& checkpoint_dir, bool checkpoints,
                               const std::vector<report::Input>& inputs);

// The same for parallel.offload = "nvme": offload.path is a writable
// directory or can be made (else the first step would fail with exit 1).
void check_offload_dir(MPI_Comm comm, const std::string& dir);

// An exclusive claim on a path: the file "<path>.lock", created by rank 0
// with O_EXCL, holding "host pid". A second run on the path is refused (input
// error naming the holder); a claim left by a process of this host that no
// longer exists is stale and taken over (said on stdout). Released by the
// destructor, or by release() on any rank (a failing rank ending the job).
class PathClaim {
 public:
  PathClaim(MPI_Comm comm, const std::string& path, const char* what);
  ~PathClaim() {
    if (rank_ == 0) release();
  }
  PathClaim(const PathClaim&) = delete;
  PathClaim& operator=(const PathClaim&) = delete;
  void release();
  const std::string& lock_path() const { return lock_; }

 private:
  std::string lock_, content_;  // what this claim wrote (the same on every rank)
  bool held_ = false;
  int rank_ = 0;
};

}  // namespace strata::train
