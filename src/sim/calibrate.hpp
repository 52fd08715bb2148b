// `strata calibrate`: measures the machine at hand and writes its machine
// description (docs/machines.md), the file `strata simulate --machine PATH`
// reads. Every rank measures at once, as the ranks of a run share the node:
//   products   GEMMs of several shapes, fitted as peak x d / (d + half_dim)
//              (d the smallest dimension);
//   memory     a streaming kernel's bytes per second; other arithmetic from
//              a cache-resident elementwise kernel; a tiny kernel's latency;
//   kernels    each operation of a model step at a small model's shape,
//              timed against the machine model's time for its declared cost
//              (the meta device's count): the measured factor per kernel;
//   network    every collective the strategies use, per group size, over a
//              range of sizes, fitted as latency + bytes x bus factor /
//              bandwidth with the fit's relative residual; how much of a
//              non-blocking all-reduce progresses while a rank computes;
//   storage    a file written and read back beside the output (NVMe offload).
// On the CPU a device is one rank with its threads; on a GPU build the
// selected device. With --quick it takes well under two minutes on 2 cores.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "src/sim/machine.hpp"

namespace strata::sim {

// How far apart one measurement's repeats were: (slowest - fastest) /
// median of its batches, the slowest rank's.
struct Spread {
  std::string what;
  double spread = 0;
};

// What makes a calibrated description untrustworthy, each with what to do:
// a machine busy when measured (`load`, the 1-minute load average, beyond
// the `cores` the node has, less the ranks' own `busy` threads), the
// measurements whose repeats spread beyond kTrustedSpread (one line), a collective
// faster than the memory it moves through (a node-level bus bandwidth above
// the memory bandwidth) or slower to start than kTrustedLatency, a fit whose
// residual exceeds kTrustedResidual. Empty when there is none.
inline constexpr double kTrustedSpread = 0.25, kTrustedLatency = 1e-3, kTrustedResidual = 0.5;
std::vector<std::string> trust_problems(const Machine& m, const std::vector<Spread>& spreads, double load, int cores,
                                        int busy);

struct CalibrateOptions {
  std::string output;  // default: results/machine-<host>.toml
  bool quick = false;
  int threads = 1;     // per rank
  std::string command_line;
};

// Collective over `comm`; rank 0 prints the figures and writes the file.
int calibrate(const CalibrateOptions& o, MPI_Comm comm);

}  // namespace strata::sim
