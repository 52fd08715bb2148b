// The CUDA backend: every operation of kernels/ops.inc on device pointers,
// with the same contracts (shapes, accumulation into gradients, fp32
// arithmetic), launched on the current device's default stream in the order
// they are called. The CPU backend is the reference each one is tested
// against on the same random inputs (tests/unit/test_cuda_kernels.cpp, run
// on a GPU; skipped without one). Called through strata::kernels once the
// process selected the device (kernels::use_device(Device::cuda)).
//
// Built when nvcc is found (STRATA_WITH_CUDA=AUTO) or asked for (ON).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/foundation/precision.hpp"

namespace strata::kernels::cuda {

// ---- runtime ----
// CUDA devices usable from this process: 0 without a driver or a GPU (never
// throws, so a test can skip with the reason).
int device_count();
// Why device_count() is 0 ("no CUDA driver", the runtime's message), or the
// first device's name and compute capability.
std::string describe_devices();
// "CUDA runtime 13.0, driver 13.0, cuBLAS 13.0.0; NVIDIA H200 (sm_90)" for the process's GPU.
std::string describe_versions();
// Makes GPU `ordinal` current for this process's kernels, cuBLAS and memory.
void use_device(int ordinal);
void synchronize();

// Device memory.
void* malloc_device(std::size_t bytes);
void free_device(void* p);
// Any direction, from the pointers (unified addressing).
void copy_bytes(void* dst, const void* src, std::size_t bytes);
void zero_bytes(void* p, std::size_t bytes);
// cudaMemGetInfo: free and total bytes of the current device.
void memory_info(std::size_t* free_bytes, std::size_t* total_bytes);

// GEMM arithmetic: fp32, or (bf16) fp32 inputs rounded to bf16 with fp32
// accumulation on tensor cores (CUBLAS_COMPUTE_32F_FAST_16BF).
void set_gemm_precision(core::Precision p);
// True when set_gemm_precision was given bf16: the fused attention then runs
// its products on tensor cores too (bf16 inputs, fp32 accumulation).
bool bf16_math();
// The best of `reps` n^3 GEMMs on device buffers of random-looking values
// (zeros run faster), in FLOP/s: at p = bf16 (fp16) 16-bit inputs and
// outputs with fp32 accumulation, the tensor cores' rate MFU is measured
// against under mixed precision; at fp32 sgemm.
double measure_gemm_flops(int n, int reps, core::Precision p);

#include "kernels/ops.inc"

}  // namespace strata::kernels::cuda
