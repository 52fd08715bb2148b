// Running a deck: the SPMD entry point behind `strata run`. Validates the
// layout against the world, sets up threads, the memory tracker and the peak,
// trains, prints a per-step table and a summary on rank 0, and writes the
// HDF5 report (status "complete", or "failed" with what it had).
#pragma once

#include <mpi.h>

#include <string>

#include "src/deck/deck.hpp"

namespace strata::train {

struct RunOptions {
  std::string output;        // overrides run.output when not empty
  bool dry_run = false;      // validate and print the plan; write nothing
  std::string command_line;
  int checkpoint_every = 0;  // write a checkpoint after every N steps (0: never)
  std::string checkpoint_dir;  // default: checkpoints/<run.name>
  std::string resume;        // a checkpoint (or a directory of them) to continue from
  bool force = false;        // replace a file at the report path named
};

// Returns the process exit status (0). Throws core::Error on failure.
int run_deck(const deck::Deck& deck, const RunOptions& options, MPI_Comm comm);

}  // namespace strata::train
