#include <string>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"

namespace strata::kernels::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error: a machine without a GPU is not a failure
    return 0;
  }
  return n;
}

std::string describe_devices() {
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    return std::string("no usable CUDA device: ") + cudaGetErrorString(rc);
  }
  if (n == 0) return "no CUDA device";
  cudaDeviceProp p{};
  STRATA_CHECK_CUDA(cudaGetDeviceProperties(&p, 0));
  return std::to_string(n) + " CUDA device(s); device 0: " + p.name + " (sm_" + std::to_string(p.major) +
         std::to_string(p.minor) + ", " + std::to_string(p.totalGlobalMem >> 20) + " MiB)";
}

void synchronize() { STRATA_CHECK_CUDA(cudaDeviceSynchronize()); }

void* malloc_device(std::size_t bytes) {
  void* p = nullptr;
  STRATA_CHECK_CUDA(cudaMalloc(&p, bytes));
  return p;
}

void free_device(void* p) { STRATA_CHECK_CUDA(cudaFree(p)); }

void copy_to_device(void* dst, const void* src, std::size_t bytes) {
  STRATA_CHECK_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

void copy_to_host(void* dst, const void* src, std::size_t bytes) {
  STRATA_CHECK_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

}  // namespace strata::kernels::cuda
