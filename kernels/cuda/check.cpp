#include "kernels/cuda/check.hpp"

#include "kernels/foundation/error.hpp"

namespace strata::kernels::cuda {

void cuda_failed(const char* call, cudaError_t rc, const char* file, int line) {
  core::runtime_error("{} failed: {} ({}:{})", call, cudaGetErrorString(rc), file, line);
}

void cublas_failed(const char* call, int status, const char* file, int line) {
  core::runtime_error("{} failed: cuBLAS status {} ({}:{})", call, status, file, line);
}

}  // namespace strata::kernels::cuda
