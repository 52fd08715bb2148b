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

namespace strata::sim {

struct CalibrateOptions {
  std::string output;  // default: results/machine-<host>.toml
  bool quick = false;
  int threads = 1;     // per rank
  std::string command_line;
};

// Collective over `comm`; rank 0 prints the figures and writes the file.
int calibrate(const CalibrateOptions& o, MPI_Comm comm);

}  // namespace strata::sim
