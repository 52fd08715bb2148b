// `strata run --dry-run`: the estimate of every rank of a deck's layout,
// computed in one process at any scale by running a step on the meta device
// (src/train/estimate.hpp), printed (memory per pool and category held and
// at peak, collectives and compute per step, the mesh table) and, with
// --output, written as a report of status "estimate".
#pragma once

#include <mpi.h>

#include "src/deck/deck.hpp"
#include "src/train/run_options.hpp"

namespace strata::train {

// Rank 0 of `comm` does the work; the others take its verdict, so that an
// error ends every rank alike. Returns 3 when a rank's peak exceeds a memory
// limit, else 0.
int dry_run(const deck::Deck& deck, const RunOptions& options, MPI_Comm comm);

}  // namespace strata::train
