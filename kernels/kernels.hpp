// The kernel interface: every numerical operation a model or a strategy needs,
// declared once (kernels/ops.inc) and implemented per backend: kernels/cpu
// (OpenMP + OpenBLAS) and kernels/cuda (cuBLAS + CUDA kernels). The functions
// in strata::kernels run on the device the process selected with use_device()
// (the CPU unless told otherwise); strata::kernels::cpu names the CPU backend
// directly, for work that stays on the host whatever the device (an optimizer
// offloaded to host memory). Kernels never allocate: every buffer, scratch
// included, is passed in, so that memory stays in plain sight and is
// accounted for by the caller.
//
// Conventions
//   * Row-major, contiguous unless a leading dimension says otherwise.
//   * Tensors are core::Ptr / CPtr: an address and a format (fp32, bf16,
//     fp16; kernels/foundation/ptr.hpp); ops.inc says which arguments share
//     the call's format and which are always fp32.
//   * Pointers are on the selected device (host memory for the CPU).
//   * Shapes: B batch, T sequence, C channels (d_model), NH heads, V vocab,
//     N = B*T rows.
//   * Backward kernels ACCUMULATE (+=) into every gradient output; callers zero
//     gradient buffers when a new accumulation starts. The one exception is
//     softmax_cross_entropy_backward, which writes its output so that it may
//     overwrite the logits in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/foundation/precision.hpp"
#include "kernels/foundation/ptr.hpp"

namespace strata::kernels {

// ---- the device ----
// cuda and kokkos: the device backends, each a module loaded by the first
// call that needs it (kernels/backend_table.hpp), so a CPU run never loads
// their libraries. kokkos runs the operations on Kokkos' default execution
// space (kernels/kokkos: Serial, OpenMP, CUDA, HIP, SYCL, whichever the
// Kokkos it was built against has).
// meta: the device a dry run executes a step on (as PyTorch's meta tensors):
// buffers have no memory behind them, kernels and copies do nothing and
// reductions return 0. What a step allocates and communicates on it is what
// the same step allocates and communicates on a real device, because it is
// the same code.
enum class Device { cpu, cuda, kokkos, meta };
// "cpu" | "cuda" | "kokkos" | "meta"
const char* device_name(Device d);
// True when this build has the CUDA backend (STRATA_WITH_CUDA): the module
// libstrata_cuda.so, loaded by the first call that needs a GPU
// (use_device(Device::cuda), gpu_count(), describe_gpus()).
bool cuda_built();
// True when this build has the Kokkos backend (STRATA_WITH_KOKKOS): the
// module libstrata_kokkos.so.
bool kokkos_built();
// The devices this build can run on: "cpu, cuda, kokkos".
std::string built_devices();
// Selects where every kernel of strata::kernels runs, for the whole process.
// cuda, kokkos: device `ordinal` (a runtime error naming what is missing when
// the build has no such backend, its module does not load, or there is no
// such device).
void use_device(Device d, int ordinal = 0);
Device device();
// The ordinal use_device() selected (the GPU of a cuda process).
int device_ordinal();
// device() == Device::meta: host values need not be computed for it.
bool is_meta();
// True when the selected device's memory is host memory (the CPU, and a
// Kokkos backend whose memory space the host can read): host code and MPI
// may then touch buffers directly; otherwise copies go through copy_bytes.
bool host_memory();
// GPUs this process can use (0 without the CUDA backend, a driver or a GPU).
int gpu_count();
// The same for any device: the devices of backend d this process can use
// (1 for the CPU), and why there are none.
int device_count(Device d);
std::string describe_devices(Device d);
// The GPUs as the driver sees them, or why there are none ("no usable CUDA
// device: ..."), for messages.
std::string describe_gpus();
// Name of the backend and its libraries, for the report ("cpu/openblas-openmp").
const char* backend_name();
// The libraries' versions and the device, for the report's provenance:
// OpenBLAS's configuration on the CPU; on a GPU the CUDA runtime and driver,
// cuBLAS, and the GPU's name and compute capability.
std::string library_versions();

// ---- memory on the selected device (host memory for the CPU) ----
// One large region for the tracked arena; the driver is not called per buffer.
void* device_alloc(std::size_t bytes);
void device_free(void* p);
// Bytes between any two of host and device memory (the direction is taken
// from the pointers); ordered after every kernel launched before it.
void copy_bytes(void* dst, const void* src, std::size_t bytes);
void zero_bytes(void* p, std::size_t bytes);
// Waits for every kernel launched so far (a no-op on the CPU).
void synchronize();
// The driver's view of the device: free and total bytes (the host's for the CPU).
struct DeviceMemory {
  std::size_t free = 0, total = 0;
};
DeviceMemory device_memory();

// The CPU standing in for a GPU, for tests: the host pages of [base, base +
// bytes) become inaccessible except while a kernel or a copy of this
// interface runs, as a GPU's memory is to the host. A host access anywhere
// else (code reading device memory as if it were host memory) faults.
// bytes = 0 ends it. CPU only; the region must be page-aligned.
void guard_device_memory(void* base, std::size_t bytes);

// ---- numerics ----
// The best FLOP/s of `reps` n x n x n GEMMs on the selected device: the CPU's
// sgemm; on a GPU, under mixed precision (p not fp32) bf16 inputs with fp32
// accumulation (the tensor cores' rate), else sgemm. Buffers are its own.
double measure_gemm_flops(int n, int reps, core::Precision p);

// Threads used by OpenMP loops and by BLAS on the host.
void set_num_threads(int n);
int num_threads();

// ---- the work counted on the meta device: a dry run's compute ----
// Every operation run on the meta device adds its cost (kernels/meta/) under
// the thread's current work (prof::current_work: the layer and phase of the
// innermost span, or the recomputation inside a backward pass): FLOPs of
// matrix products (GEMMs and attention's two products, as the model's FLOPs
// count them) apart from all other FLOPs, the bytes read and written, and
// the kernels launched. Phases: "forward", "backward", "backward_input",
// "backward_weight", "recompute", "optimizer".
struct WorkCost {
  int layer = -1;  // 0 embedding, 1..L blocks, L+1 head and loss, -1 whole-model work
  std::string phase;
  double matmul_flops = 0, other_flops = 0, bytes = 0;
  std::int64_t kernels = 0;
};
std::vector<WorkCost> meta_costs();  // by layer, then phase
void reset_meta_costs();
// What a meta operation calls: its name (kernels/ops.inc), cost and, for a
// matrix product, its shape. Also recorded into the thread's trace, if any
// (kernels/foundation/trace.hpp).
void count_meta_cost(const char* name, double matmul_flops, double other_flops, double bytes, int m = 0, int n = 0,
                     int k = 0);

// Elements of attention_forward's `state` and attention_backward's
// `scratch`, and their format for a run whose activations are `act`: the
// probabilities and their gradient on the CPU, in the activations' format;
// for the fused kernels (`fused`, the CUDA backend) the rows' log-sum-exp,
// and their dot(dout, out) and, under 16 bits, an accumulator of dq (B T C),
// fp32 (fp32's dq is summed in dqkv itself).
std::int64_t attention_state_elements(bool fused, int B, int NH, int T);
std::int64_t attention_scratch_elements(bool fused, int B, int NH, int T, int C, core::Precision act);
inline core::Precision attention_state_format(bool fused, core::Precision act) {
  return fused ? core::Precision::fp32 : act;
}

// How the CPU backend multiplies 16-bit matrices: "onednn" (bf16 through
// oneDNN's matmul, where the processor has AVX512-BF16 or AMX), or "openblas"
// (widened to fp32 tile by tile and multiplied by sgemm). fp32 always goes to
// OpenBLAS. For the report's provenance.
const char* cpu_gemm_path(core::Precision p);

#include "kernels/ops.inc"

}  // namespace strata::kernels
