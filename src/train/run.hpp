// Running a deck: the SPMD entry point behind `strata run`. Validates the
// layout against the world, sets up threads, the memory tracker and the peak,
// trains, prints a per-step table and a summary on rank 0, and writes the
// HDF5 report (status "complete", or "failed" with what it had).
#pragma once

#include <mpi.h>

#include "src/deck/deck.hpp"
#include "src/train/run_options.hpp"

namespace strata::train {

// Returns the process exit status (0). Throws core::Error on failure.
int run_deck(const deck::Deck& deck, const RunOptions& options, MPI_Comm comm);

}  // namespace strata::train
