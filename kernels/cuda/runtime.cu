#include <string>

#include <cublas_v2.h>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/launch.cuh"

namespace strata::kernels::cuda {

const char* backend_name() { return "cuda/cublas"; }

// Device memory is the GPU's, out of the host's reach.
bool host_accessible() { return false; }

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

namespace {
int g_ordinal = 0;  // the process's GPU
}  // namespace

std::string describe_versions() {
  int rt = 0, drv = 0, blas = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  cublasGetProperty(MAJOR_VERSION, &blas);
  int minor = 0, patch = 0;
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  cudaDeviceProp p{};
  STRATA_CHECK_CUDA(cudaGetDeviceProperties(&p, g_ordinal));
  auto v = [](int x) { return std::to_string(x / 1000) + "." + std::to_string(x % 1000 / 10); };
  return "CUDA runtime " + v(rt) + ", driver " + v(drv) + ", cuBLAS " + std::to_string(blas) + "." +
         std::to_string(minor) + "." + std::to_string(patch) + "; " + p.name + " (sm_" + std::to_string(p.major) +
         std::to_string(p.minor) + ")";
}

namespace {

// The current device is per host thread: copies made on other threads (the
// optimizer's offload copies, NVMe I/O) select the process's GPU first.
void on_this_gpu() { STRATA_CHECK_CUDA(cudaSetDevice(g_ordinal)); }
}  // namespace

void use_device(int ordinal) {
  STRATA_CHECK_CUDA(cudaSetDevice(ordinal));
  g_ordinal = ordinal;
}

void synchronize() { STRATA_CHECK_CUDA(cudaDeviceSynchronize()); }

void* malloc_device(std::size_t bytes) {
  void* p = nullptr;
  STRATA_CHECK_CUDA(cudaMalloc(&p, bytes));
  return p;
}

void free_device(void* p) { STRATA_CHECK_CUDA(cudaFree(p)); }

// cudaMemcpy on the legacy default stream: ordered after every kernel
// launched before it, and the host waits for a copy into host memory.
void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  on_this_gpu();
  STRATA_CHECK_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

void zero_bytes(void* p, std::size_t bytes) {
  if (bytes > 0) STRATA_CHECK_CUDA(cudaMemsetAsync(p, 0, bytes));
}

void memory_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  STRATA_CHECK_CUDA(cudaMemGetInfo(free_bytes, total_bytes));
}

double* reduction_slot() {
  static double* slot = static_cast<double*>(malloc_device(sizeof(double)));
  return slot;
}

}  // namespace strata::kernels::cuda
