// The CUDA backend as the module libstrata_cuda.so hands it over: one table
// of its entry points (the runtime functions of cuda_kernels.hpp and every
// operation of kernels/ops.inc), which kernels/dispatch.cpp calls once
// use_device(Device::cuda) has loaded the module (kernels/foundation/module.hpp).
// A CPU run therefore never loads the CUDA runtime, cuBLAS, cuBLASLt or NCCL.
//
// The operations' rows come from kernel_ops.inc, which the build generates
// from ops.inc (one STRATA_OP(name) per declaration): an operation added
// there joins the table without a second list. Plain C++: no CUDA header.
#pragma once

#include <cstddef>

#include "kernels/cuda/cuda_kernels.hpp"

namespace strata::kernels {

// Changed with the table's layout: a module from another build is refused
// (abi and size are checked) instead of being called through wrong slots.
inline constexpr int kCudaBackendAbi = 1;

struct CudaBackend {
  int abi = 0;
  std::size_t size = 0;
  decltype(&cuda::device_count) device_count = nullptr;
  decltype(&cuda::describe_devices) describe_devices = nullptr;
  decltype(&cuda::describe_versions) describe_versions = nullptr;
  decltype(&cuda::use_device) use_device = nullptr;
  decltype(&cuda::synchronize) synchronize = nullptr;
  decltype(&cuda::malloc_device) malloc_device = nullptr;
  decltype(&cuda::free_device) free_device = nullptr;
  decltype(&cuda::copy_bytes) copy_bytes = nullptr;
  decltype(&cuda::zero_bytes) zero_bytes = nullptr;
  decltype(&cuda::memory_info) memory_info = nullptr;
  decltype(&cuda::set_gemm_precision) set_gemm_precision = nullptr;
  decltype(&cuda::measure_gemm_flops) measure_gemm_flops = nullptr;
#define STRATA_OP(name) decltype(&cuda::name) name = nullptr;
#include "kernel_ops.inc"
#undef STRATA_OP
};

// The module's entry point: its table, filled (kernels/cuda/module.cpp).
using CudaBackendEntry = const CudaBackend*();
inline constexpr const char* kCudaBackendEntry = "strata_cuda_kernels";

}  // namespace strata::kernels
