// What the CUDA-aware communicators (nccl_communicator.hpp,
// staged_communicator.hpp) share: telling device buffers from host ones, and
// CUDA return codes turned into exceptions. Built only with the CUDA backend.
// The check macro has its own name so that it cannot clash with the kernels'
// STRATA_CHECK_CUDA (kernels/cuda/check.hpp) in a file that includes both.
#pragma once

#include <cuda_runtime.h>

namespace strata::comm {

// True for memory the GPU owns: device allocations and managed memory.
// Anything else is host memory, including pointers CUDA does not know
// (pageable allocations), null, and any pointer at all when there is no
// usable GPU or driver: the query's error is cleared so that it does not
// surface in a later, unrelated CUDA call.
bool is_device_memory(const void* p);

// A failed CUDA call: a runtime core::Error naming the call, the place and
// cudaGetErrorString's text.
[[noreturn]] void cuda_failed(const char* expr, cudaError_t code, const char* file, int line);

}  // namespace strata::comm

#define STRATA_COMM_CHECK_CUDA(expr)                                               \
  do {                                                                             \
    const cudaError_t strata_cuda_rc_ = (expr);                                    \
    if (strata_cuda_rc_ != cudaSuccess)                                            \
      ::strata::comm::cuda_failed(#expr, strata_cuda_rc_, __FILE__, __LINE__);     \
  } while (0)
