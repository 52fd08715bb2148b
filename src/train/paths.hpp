// The paths a run writes: checked before step 1 (bad input, exit 2, rather
// than a failure after the whole run), and claimed for the run's lifetime so
// that two runs never write one report or one checkpoint directory.
#pragma once

#include <mpi.h>

#include <string>

namespace strata::train {

// Rank 0 checks, every rank takes the verdict: the report path is not a
// directory, not the deck or the data it reads, and its directory can be
// written (or made); the checkpoint directory (when `checkpoints` is set) is
// a directory or can be made. Input error naming the path and the problem.
void check_output_paths(MPI_Comm comm, const std::string& report, const std::string& checkpoint_dir,
                        bool checkpoints, const std::string& deck_path, const std::string& data_path);

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
