// The CPU backend's 16-bit GEMMs on oneDNN (Debian's libdnnl-dev): bf16 inputs,
// fp32 accumulation, a bf16 or fp32 result, on the processor's bf16
// instructions (AVX512-BF16, AMX). Built where the library is found
// (STRATA_HAVE_DNNL); used only where the processor has those instructions,
// which oneDNN reports at run time. Elsewhere matmul.cpp widens to fp32 and
// calls OpenBLAS.
#pragma once

#include "kernels/foundation/ptr.hpp"

namespace strata::kernels::cpu {

// Whether 16-bit GEMMs of format p go through oneDNN on this processor.
bool onednn_gemm(core::Precision p);
// "onednn 2.6.3 (bf16 instructions)", or why not: for the report's provenance.
const char* onednn_description();
// matmul's contract (kernels/ops.inc) on oneDNN; only where onednn_gemm(A's format).
void onednn_matmul(bool trans_a, bool trans_b, int M, int N, int K, float alpha, core::CPtr A, int lda, core::CPtr B,
                   int ldb, float beta, core::Ptr C, int ldc);

}  // namespace strata::kernels::cpu
