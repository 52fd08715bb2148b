// The kernels' half of the CUDA module's entry points: the table
// kernels/dispatch.cpp calls through (backend_table.hpp).
#include "kernels/cuda/backend_table.hpp"

namespace {

strata::kernels::CudaBackend fill() {
  namespace cuda = strata::kernels::cuda;
  strata::kernels::CudaBackend t;
  t.abi = strata::kernels::kCudaBackendAbi;
  t.size = sizeof t;
  t.device_count = &cuda::device_count;
  t.describe_devices = &cuda::describe_devices;
  t.describe_versions = &cuda::describe_versions;
  t.use_device = &cuda::use_device;
  t.synchronize = &cuda::synchronize;
  t.malloc_device = &cuda::malloc_device;
  t.free_device = &cuda::free_device;
  t.copy_bytes = &cuda::copy_bytes;
  t.zero_bytes = &cuda::zero_bytes;
  t.memory_info = &cuda::memory_info;
  t.set_gemm_precision = &cuda::set_gemm_precision;
  t.measure_gemm_flops = &cuda::measure_gemm_flops;
#define STRATA_OP(name) t.name = &cuda::name;
#include "kernel_ops.inc"
#undef STRATA_OP
  return t;
}

}  // namespace

extern "C" const strata::kernels::CudaBackend* strata_cuda_kernels() {
  static const strata::kernels::CudaBackend table = fill();
  return &table;
}
