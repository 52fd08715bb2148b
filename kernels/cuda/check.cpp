#include "kernels/cuda/check.hpp"

#include "kernels/foundation/error.hpp"

namespace strata::kernels::cuda {

void cuda_failed(const char* call, cudaError_t rc, const char* file, int line) {
  core::runtime_error("{} failed: {} ({}:{})", call, cudaGetErrorString(rc), file, line);
}

void cublas_failed(const char* call, int status, const char* file, int line) {
  core::runtime_error("{} failed: cuBLAS status {} ({}:{})", call, status, file, line);
}

void formats_refused(const char* op, core::Precision a, core::Precision b, core::Precision c) {
  core::runtime_error("internal check failed: {} of {} and {} elements into {} ones", op, core::precision_name(a),
                      core::precision_name(b), core::precision_name(c));
}

}  // namespace strata::kernels::cuda
