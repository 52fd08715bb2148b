// CUDA return codes to exceptions naming the call (no silent failures).
// The message is formatted in a C++ translation unit (check.cpp): nvcc
// rejects fmt's compile-time format strings, so .cu files never call fmt.
#pragma once

#include <cuda_runtime.h>

#include "kernels/foundation/precision.hpp"

namespace strata::kernels::cuda {
[[noreturn]] void cuda_failed(const char* call, cudaError_t rc, const char* file, int line);
[[noreturn]] void cublas_failed(const char* call, int status, const char* file, int line);
// An operation handed tensors whose formats do not go together (a bug in
// the caller): its operands' formats a and b and its result's c.
[[noreturn]] void formats_refused(const char* op, core::Precision a, core::Precision b, core::Precision c);
}

#define STRATA_CHECK_CUDA(call)                                                              \
  do {                                                                                       \
    const cudaError_t strata_cuda_rc = (call);                                               \
    if (strata_cuda_rc != cudaSuccess)                                                       \
      ::strata::kernels::cuda::cuda_failed(#call, strata_cuda_rc, __FILE__, __LINE__);       \
  } while (0)

// After a kernel launch: a bad configuration shows here, not at a later sync.
#define STRATA_CHECK_LAUNCH() STRATA_CHECK_CUDA(cudaGetLastError())
