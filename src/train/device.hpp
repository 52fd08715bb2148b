// Device selection: which device a rank runs on, how many ranks share it,
// the device arena every tracked buffer of the run lives in, and the
// communicators' backend for that device. Collective over the run's ranks.
#pragma once

#include <mpi.h>

#include <cstddef>

#include "kernels/foundation/memory.hpp"
#include "plan/plan.hpp"
#include "src/comm/backend.hpp"

namespace strata::train {

// On the CPU without backend.memory_limit, the ranks of a node share its
// memory: when their fp32 parameters alone exceed it, the run is refused
// before anything is allocated (instead of a std::bad_alloc or the kernel's
// OOM killer later). Agreed: nodes may differ.
void check_host_holds_parameters(const plan::Plan& cfg, MPI_Comm comm);

// backend.device = "cuda": rank r of a node takes GPU r mod the node's GPU
// count (ranks share a GPU only when there are more of them than GPUs).
// "kokkos": the same over the devices of Kokkos' default execution space
// (one, the host, for a host-side Kokkos). Returns how many ranks share this
// rank's device (1 on the CPU).
int select_device(const plan::Plan& cfg, MPI_Comm comm);

// backend.comm for the selected device: NCCL on a GPU unless told otherwise;
// MPI with device buffers staged through host memory (Debian's MPICH is not
// CUDA-aware); MPI on the host.
comm::Backend comm_backend(const plan::Plan& cfg);

// The device arena: one region of the GPU for every tracked buffer, sized
// backend.memory_limit, or, without a limit, the free memory less a reserve
// for what the tracker does not hold (the CUDA context's own allocations,
// cuBLAS workspaces, NCCL's buffers), divided among the ranks that share the
// GPU (every rank reads the free memory before any allocates). Freed after
// the tracker that uses it.
struct DeviceArena {
  void* base = nullptr;
  std::size_t capacity = 0;
  DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena();
  // Collective: `sharing` ranks share this rank's device.
  void open(std::size_t limit, core::MemoryTracker& tracker, int sharing, MPI_Comm comm);
};

}  // namespace strata::train
