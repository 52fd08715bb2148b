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

#include "kernels/foundation/ptr.hpp"

namespace strata::kernels::cuda {

// ---- runtime (kernels/runtime.inc) ----
// device_count: CUDA devices; describe_versions: "CUDA runtime 13.0, driver
// 13.0, cuBLAS 13.0.0; NVIDIA H200 (sm_90)"; copies in any direction
// (unified addressing); memory_info: cudaMemGetInfo; measure_gemm_flops at
// bf16 (fp16): 16-bit inputs and outputs with fp32 accumulation, the tensor
// cores' rate MFU is measured against under mixed precision; at fp32 sgemm.
// A GEMM's arithmetic follows its operands' format: 16-bit operands on tensor
// cores with fp32 accumulation, fp32 ones in fp32 (TF32 would change results
// beyond the tests' bound).
#include "kernels/runtime.inc"

#include "kernels/ops.inc"

// Whole-sequence attention for head sizes above the fused kernels' 128, up to
// 256 (ring_attention.cu): the sequence as one block of queries against one
// block of keys on the ring's warp-per-row kernels, keys and values read in
// place from qkv's rows; attention_forward and attention_backward's contracts
// (lse as their state; D is not needed).
void attention_forward_wide(core::Ptr out, float* lse, core::CPtr qkv, int B, int T, int C, int NH, int NKV);
void attention_backward_wide(core::Ptr dqkv, core::CPtr dout, core::CPtr qkv, core::CPtr out, const float* lse,
                             int B, int T, int C, int NH, int NKV);

}  // namespace strata::kernels::cuda
