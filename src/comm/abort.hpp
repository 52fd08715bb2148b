// Ending the whole job from one failing rank: its message first, then
// MPI_Abort, so no rank is left waiting in a collective. The launcher
// forwards a rank's stderr through its proxy, and MPI_Abort tears the job
// down at once: without a pause the message can be lost on the way (seen
// with MPICH's hydra), so the rank gives the proxy a moment to pass it on.
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <thread>

namespace strata::comm {

[[noreturn]] inline void abort_job(MPI_Comm comm, int rank, const std::string& message, int code) {
  std::fprintf(stderr, "strata: rank %d failed: %s\n", rank, message.c_str());
  std::fflush(stderr);
  fsync(STDERR_FILENO);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  MPI_Abort(comm, code);
  std::_Exit(code);  // MPI_Abort does not return; this is for the compiler
}

}  // namespace strata::comm
