// A device backend as its module hands it over: one table of its entry points
// (the runtime of kernels/runtime.inc and every operation of kernels/ops.inc),
// which kernels/dispatch.cpp calls once use_device() has loaded the module
// (kernels/foundation/module.hpp). A CPU run therefore never loads a device
// backend's libraries (the CUDA runtime, cuBLAS; Kokkos).
//
// The operations' rows come from kernel_ops.inc, which the build generates
// from ops.inc (one STRATA_OP(name) per declaration): an operation added
// there joins every backend's table without a second list, and a backend
// missing it fails to link. Plain C++: no backend's header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/foundation/ptr.hpp"

namespace strata::kernels {

// The slots' types: declarations only, never defined.
namespace backend {
#include "kernels/runtime.inc"
#include "kernels/ops.inc"
}  // namespace backend

// Changed with the table's layout: a module from another build is refused
// (abi and size are checked) instead of being called through wrong slots.
inline constexpr int kBackendAbi = 3;

// The runtime's rows; the operations' come from kernel_ops.inc.
#define STRATA_RUNTIME_ROWS(ROW)                                                                                      \
  ROW(backend_name) ROW(device_count) ROW(describe_devices) ROW(describe_versions) ROW(use_device) ROW(synchronize) \
  ROW(host_accessible) ROW(malloc_device) ROW(free_device) ROW(copy_bytes) ROW(zero_bytes) ROW(memory_info)         \
  ROW(measure_gemm_flops)

struct DeviceBackend {
  int abi = 0;
  std::size_t size = 0;
#define STRATA_SLOT(name) decltype(&backend::name) name = nullptr;
  STRATA_RUNTIME_ROWS(STRATA_SLOT)
#define STRATA_OP(name) STRATA_SLOT(name)
#include "kernel_ops.inc"
#undef STRATA_OP
#undef STRATA_SLOT
};

// A backend module's entry point is `extern "C" const DeviceBackend*
// strata_<name>_kernels()`, which kernels/backend_module.inc defines.
inline std::string backend_entry(const std::string& name) { return "strata_" + name + "_kernels"; }

}  // namespace strata::kernels
