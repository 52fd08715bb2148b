#include "src/comm/cuda_support.hpp"

#include "kernels/foundation/error.hpp"

namespace strata::comm {

bool is_device_memory(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    // No GPU, no driver, or a pointer CUDA cannot classify: host memory.
    // The error is sticky until read; read it so later calls do not see it.
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

void cuda_failed(const char* expr, cudaError_t code, const char* file, int line) {
  core::runtime_error("CUDA call `{}` failed at {}:{}: {} (code {})", expr, file, line, cudaGetErrorString(code),
                      int(code));
}

}  // namespace strata::comm
