// A machine description: what the simulator needs to know about hardware to
// time a step it never runs (docs/machines.md). Written by `strata calibrate`
// for the machine at hand, or by hand, with sources, for hardware not at hand
// (inputs/machines/). Parsed once into these typed values; a missing or
// negative figure is bad input naming file, line and key.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kernels/foundation/precision.hpp"

namespace strata::sim {

// A collective's time as latency plus bytes over bandwidth, measured on
// this machine for one op and group size (calibrate's fit), and the times it
// was fitted to. A library switches protocols and algorithms with the size,
// and caches hold small buffers and not large ones, so one line misses some
// sizes by a factor of two: between the sizes measured, the simulator
// interpolates the measured times instead, and uses the line outside them.
struct CommFit {
  std::string level;  // "node" or "cluster"
  std::string op;     // as the /comm table names it
  int group_size = 2;
  double latency = 0;    // s
  double bandwidth = 0;  // B/s of bus bandwidth (bytes x the nccl-tests factor / time)
  double residual = 0;   // the fit's relative RMS error over the sizes measured
  bool nonblocking = false;  // the non-blocking form, issued and waited for at once
  std::vector<double> bytes;    // the sizes measured, increasing (bytes as /comm counts a call's)
  std::vector<double> seconds;  // the time of a call of each
};

// One level of the network: inside a node (NVLink, shared memory), or
// across nodes (InfiniBand).
struct NetworkLevel {
  double bandwidth = 0;  // node: a group's bus bandwidth; cluster: per node, every NIC together (B/s)
  double latency = 0;    // s per step of a ring
};

struct Machine {
  std::string name, path, description;
  int devices_per_node = 1;
  bool gpu = false;
  double memory = 0;       // bytes per device
  double host_memory = 0;  // bytes per node
  // Peak arithmetic of one device, by precision of the matrix products.
  double peak_fp32 = 0, peak_bf16 = 0, peak_fp16 = 0;  // FLOP/s
  double matmul_efficiency = 1;  // the largest products' share of peak
  double matmul_half_dim = 0;    // the smallest dimension at which a product reaches half of that
  double vector_flops = 0;       // FLOP/s of every other operation
  double memory_bandwidth = 0;   // B/s achieved by memory-bound kernels
  double launch_latency = 0;     // s per kernel
  double host_link_bandwidth = 0;  // B/s between device and host (0: they share memory)
  double nvme_bandwidth = 0;       // B/s to local NVMe (0: none)
  // The host's share per device of its cores, for offloaded work (the
  // optimizer's update): the device's own figures on a CPU machine.
  double host_vector_flops = 0, host_memory_bandwidth = 0;
  // Measured time over the model's, per kernel (calibrate); 1 where absent.
  std::map<std::string, double> kernel_factors;
  NetworkLevel node, cluster;
  // The share of a non-blocking collective's transfer that progresses while
  // the rank computes: 1 where a device engine moves it (NCCL), less where
  // the host must drive it (MPI without a progress thread).
  double overlap = 1;
  // How much slower a kernel runs while a call of its rank moves beside it
  // at the full rate (NCCL's kernels take SMs and memory bandwidth from it;
  // MPI's copies, cores and memory bandwidth): its time then over its time
  // alone, >= 1. At the `overlap` share the contention is that share of it.
  double compute_slowdown = 1;
  std::vector<CommFit> fits;

  double peak(core::Precision p) const {
    return p == core::Precision::bf16 ? peak_bf16 : p == core::Precision::fp16 ? peak_fp16 : peak_fp32;
  }
};

// A machine by name (inputs/machines/NAME.toml, found beside the working
// directory, under $STRATA_MACHINES, or in the source tree) or by path.
// Unknown names are bad input listing the known ones.
Machine load_machine(const std::string& name_or_path);
// The file a name or path stands for ("" for an unknown name): what a
// command reads, so that no output of it is written there.
std::string machine_path(const std::string& name_or_path);
// Parses a description's text; `path` names it in errors.
Machine parse_machine(const std::string& path, const std::string& text);
// The names of the machines shipped with Strata and found on the search path.
std::vector<std::string> known_machines();

}  // namespace strata::sim
