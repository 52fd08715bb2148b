// How a run ends when it does not simply complete: a signal asking it to
// stop, a loss that diverged, or a rank's failure. Each is agreed by every
// rank before any acts on it, so that all stop at the same step boundary,
// publish one report with the status and the reason, and none is left
// waiting in a collective for a peer that went elsewhere.
#pragma once

#include <mpi.h>

#include <string>

namespace strata::train {

// SIGINT, SIGTERM and SIGUSR1 (what `sbatch --signal` sends ahead of a time
// limit), and SIGQUIT, SIGUSR2 and SIGALRM (whose default action would end
// the process with its .partial report and its claims left behind), ask the
// run to stop at the next step boundary: the first is kept;
// a repeat within 2 s is the same request arriving twice (from the terminal
// and through mpiexec); one later restores the default action and re-raises,
// so a second Ctrl-C ends the process at once.
void install_stop_signals();
int stop_signal();                    // the first signal received, 0 if none
const char* signal_name(int signal);  // "SIGTERM"
// 143 for SIGTERM and SIGUSR1 (128 + SIGTERM: a time limit), else 128 + the
// signal (130 for SIGINT).
int interrupted_exit_code(int signal);

// What every rank saw at a step boundary: the largest pending signal (0
// none), whether any rank's loss or gradient norm was not finite, and the
// slowest rank's step time (the step's time: every rank's next step starts
// only when the slowest's collectives let it), and the most device memory a
// rank held at once in the step (the console's). One small all-reduce on
// `control`, a communicator of its own (nothing else is ever issued on it,
// so it cannot meet another collective).
struct Boundary {
  int signal = 0;
  bool diverged = false;
  double slowest_step_time = 0;
  double largest_device_peak = 0;  // bytes
};
Boundary agree_at_boundary(MPI_Comm control, bool diverged_here, double step_time, double device_peak);

// After this rank failed: whether every rank reports a failure too within
// `seconds` (a non-blocking barrier on `failures`, a communicator used for
// nothing else). True when the failure was everyone's (a memory limit every
// rank exceeds, a corrupt checkpoint): then the ranks can still write one
// report together. False when some rank is still running, waiting in a
// collective for this one.
bool every_rank_failed(MPI_Comm failures, double seconds);

// Every rank's message, the same text on every rank: each distinct message
// once, with the ranks that gave it ("rank 0-3: ..."). Collective on `comm`.
std::string agreed_message(MPI_Comm comm, const std::string& mine);

}  // namespace strata::train
