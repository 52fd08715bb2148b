#include "src/train/device.hpp"

#include <unistd.h>

#include <algorithm>

#include "kernels/foundation/error.hpp"
#include "kernels/kernels.hpp"
#include "models/model.hpp"
#include "src/comm/mpi_check.hpp"

namespace strata::train {

void check_host_holds_parameters(const plan::Plan& cfg, MPI_Comm comm) {
  double need = 0, have = 0;
  const int on_node = comm::node_place(comm).size;  // collective: every rank calls it
  if (cfg.backend.device == kernels::Device::cpu && cfg.backend.memory_limit == 0 && !cfg.offload.params) {
    const auto& p = cfg.parallel;
    // A lower bound: the experts' share is smaller still (1/ep).
    const double share =
        double(p.tp) * p.pp * (p.zero >= 3 ? p.dp * p.cp : 1) * (cfg.model.moe_experts > 0 ? p.ep : 1);
    need = 4.0 * double(models::family(cfg).parameters(cfg)) / share * on_node;
    have = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  }
  double worst[2] = {need > have ? need : 0.0, need > have ? have : 0.0};
  STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, worst, 2, MPI_DOUBLE, MPI_MAX, comm));
  if (worst[0] > 0)
    core::input_error("does not fit: the fp32 parameters of the ranks of a node alone need {}, and the node has {} "
                      "of memory (use more ranks or nodes, a smaller model, or set backend.memory_limit to try anyway)",
                      core::format_bytes(worst[0]), core::format_bytes(worst[1]));
}

int select_device(const plan::Plan& cfg, MPI_Comm comm) {
  const kernels::Device device = cfg.backend.device;
  if (device == kernels::Device::cpu) return 1;
  const char* name = kernels::device_name(device);
  if (device == kernels::Device::cuda && !kernels::cuda_built())
    core::input_error("backend.device = \"cuda\": this build has the CPU backend only; build with the CUDA backend "
                      "(cmake --preset cuda, or STRATA_WITH_CUDA=AUTO where nvcc is found)");
  if (device == kernels::Device::kokkos && !kernels::kokkos_built())
    core::input_error("backend.device = \"kokkos\": this build has no Kokkos backend (it has {}); build with "
                      "STRATA_WITH_KOKKOS=ON or AUTO where find_package(Kokkos) finds one (-DKokkos_ROOT=...)",
                      kernels::built_devices());
  const auto [local, on_node] = comm::node_place(comm);
  const int devices = kernels::device_count(device);
  if (devices == 0)
    core::runtime_error("backend.device = \"{}\" but this node has no usable {} ({})", name,
                        device == kernels::Device::cuda ? "GPU" : "device", kernels::describe_devices(device));
  // NCCL refuses two ranks of one communicator on one GPU: say so before it does.
  if (device == kernels::Device::cuda && on_node > devices && cfg.backend.comm != plan::CommChoice::mpi)
    core::runtime_error("{} ranks on this node but {} GPU(s): NCCL cannot share a GPU between ranks; start at most "
                        "{} rank(s) per node, or set backend.comm = \"mpi\" (device buffers staged through the host)",
                        on_node, devices, devices);
  kernels::use_device(device, local % devices);
  // Device buffers other than a GPU's move through MPI only when the host can
  // read them: staging is the CUDA communicators' (cudaMemcpy). Every rank
  // runs the same build, so every rank decides alike.
  int world = 1;
  STRATA_CHECK_MPI(MPI_Comm_size(comm, &world));
  if (device == kernels::Device::kokkos && !kernels::host_memory() && world > 1)
    core::runtime_error("backend.device = \"kokkos\" on {} ranks: this Kokkos' memory space ({}) is not host "
                        "memory, and MPI is handed host memory only; run one rank, or use a host-side Kokkos "
                        "(Serial, OpenMP) or backend.device = \"cuda\"",
                        world, kernels::backend_name());
  return on_node / devices + (local % devices < on_node % devices ? 1 : 0);
}

comm::Backend comm_backend(const plan::Plan& cfg) {
  if (kernels::host_memory()) return comm::Backend::mpi;
  return cfg.backend.comm == plan::CommChoice::mpi ? comm::Backend::mpi_staged : comm::Backend::nccl;
}

DeviceArena::~DeviceArena() {
  if (base != nullptr) kernels::device_free(base);
}

void DeviceArena::open(std::size_t limit, core::MemoryTracker& tracker, int sharing, MPI_Comm comm) {
  STRATA_CHECK_MPI(MPI_Barrier(comm));
  const kernels::DeviceMemory m = kernels::device_memory();
  STRATA_CHECK_MPI(MPI_Barrier(comm));
  if (m.total == 0 && limit == 0)
    core::runtime_error("{} does not report its device's memory: set backend.memory_limit (the bytes each rank's "
                        "arena takes)",
                        kernels::backend_name());
  const std::size_t reserve = std::max<std::size_t>(std::size_t(2) << 30, m.total / 20);
  const std::size_t room = (m.free > reserve ? m.free - reserve : 0) / std::size_t(sharing);
  if (limit > room)
    core::runtime_error("backend.memory_limit = {} does not fit on the GPU: {} free of {}, {} kept for the CUDA "
                        "context, cuBLAS and NCCL, the rest shared by {} rank(s)",
                        core::format_bytes(double(limit)), core::format_bytes(double(m.free)),
                        core::format_bytes(double(m.total)), core::format_bytes(double(reserve)), sharing);
  capacity = (limit > 0 ? limit : room) / 256 * 256;
  base = kernels::device_alloc(capacity);
  tracker.use_arena(base, capacity, kernels::zero_bytes);
}

}  // namespace strata::train
