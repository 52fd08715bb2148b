#include "src/train/run_control.hpp"

#include <signal.h>

#include <time.h>

#include <chrono>
#include <csignal>
#include <map>
#include <thread>
#include <vector>

#include "src/comm/mpi_check.hpp"
#include "src/train/estimate.hpp"

namespace strata::train {

namespace {

volatile std::sig_atomic_t g_signal = 0;
volatile std::sig_atomic_t g_first_at = 0;  // CLOCK_MONOTONIC seconds of the first

std::sig_atomic_t monotonic_seconds() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);  // async-signal-safe
  return std::sig_atomic_t(t.tv_sec);
}

void on_stop_signal(int sig) {
  if (g_signal == 0) {
    g_signal = sig;
    g_first_at = monotonic_seconds();
    return;
  }
  // One request often arrives twice (Ctrl-C reaches a rank from the terminal
  // and again through mpiexec): a repeat within 2 s is the same request.
  // Asked again later: the default action now.
  if (monotonic_seconds() - g_first_at < 2) return;
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void install_stop_signals() {
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads and writes in flight go on; the step boundary acts
  for (int sig : {SIGINT, SIGTERM, SIGUSR1, SIGQUIT, SIGUSR2, SIGALRM}) sigaction(sig, &sa, nullptr);
}

int stop_signal() { return g_signal; }

const char* signal_name(int signal) {
  switch (signal) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGQUIT: return "SIGQUIT";
    case SIGUSR2: return "SIGUSR2";
    case SIGALRM: return "SIGALRM";
    default: return "a signal";
  }
}

int interrupted_exit_code(int signal) { return signal == SIGUSR1 ? 128 + SIGTERM : 128 + signal; }

Boundary agree_at_boundary(MPI_Comm control, bool diverged_here, double step_time, double device_peak) {
  // Small integers, and byte counts below 2^53, are exact in a double: one
  // all-reduce for all four.
  double v[4] = {double(g_signal), diverged_here ? 1.0 : 0.0, step_time, device_peak};
  STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, v, 4, MPI_DOUBLE, MPI_MAX, control));
  return {int(v[0]), v[1] != 0, v[2], v[3]};
}

bool every_rank_failed(MPI_Comm failures, double seconds) {
  MPI_Request req = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(failures, &req) != MPI_SUCCESS) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    int done = 0;
    if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (done) return true;
    // The barrier is abandoned unfinished: the job is about to end.
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::string agreed_message(MPI_Comm comm, const std::string& mine) {
  int size = 1;
  STRATA_CHECK_MPI(MPI_Comm_size(comm, &size));
  const int len = int(mine.size());
  std::vector<int> lens(static_cast<std::size_t>(size), 0), displs(static_cast<std::size_t>(size), 0);
  STRATA_CHECK_MPI(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm));
  for (int r = 1; r < size; ++r) displs[std::size_t(r)] = displs[std::size_t(r - 1)] + lens[std::size_t(r - 1)];
  std::string all(std::size_t(displs.back() + lens.back()), '\0');
  STRATA_CHECK_MPI(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, comm));
  // Distinct messages in the order of their first rank.
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> ranks;
  for (int r = 0; r < size; ++r) {
    std::string m = all.substr(std::size_t(displs[std::size_t(r)]), std::size_t(lens[std::size_t(r)]));
    if (m.empty()) continue;
    if (ranks[m].empty()) order.push_back(m);
    ranks[m].push_back(r);
  }
  std::string out;
  for (const auto& m : order) out += (out.empty() ? "" : "; ") + ("rank " + rank_ranges(ranks[m]) + ": " + m);
  return out;
}

}  // namespace strata::train
