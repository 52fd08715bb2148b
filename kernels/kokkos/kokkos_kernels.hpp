// The Kokkos backend: every operation of kernels/ops.inc on Kokkos views and
// parallel patterns, in Kokkos' default execution space and its memory space
// (Serial or OpenMP on a host-side Kokkos, where the pointers are host
// memory; CUDA, HIP or SYCL on a device-side one). GEMMs go through
// KokkosBlas; the rest are parallel_for / parallel_reduce over ranges and
// team policies. The contracts are ops.inc's, and the CPU backend is the
// reference each operation is tested against (tests/unit/test_backend_ops.cpp).
// Attention keeps the probabilities as the CPU backend does (not fused).
//
// Built when find_package(Kokkos) finds one (STRATA_WITH_KOKKOS=AUTO), as the
// module libstrata_kokkos.so (kernels/backend_table.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/foundation/ptr.hpp"

namespace strata::kernels::kokkos {

// ---- runtime (kernels/runtime.inc) ----
// use_device starts Kokkos (Kokkos::initialize, device `ordinal` on a device
// space) and finalizes it at exit; device_count is 1 unless the space is
// CUDA's; memory_info is the host's on a host space and unknown (0, 0) on a
// device space. fp32 GEMMs go through KokkosBlas, 16-bit ones through a
// kernel of the backend's own (fp32 accumulation; KokkosBlas has no 16-bit
// GEMM).
#include "kernels/runtime.inc"

#include "kernels/ops.inc"

}  // namespace strata::kernels::kokkos
