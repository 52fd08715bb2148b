// The GEMMs' arithmetic as cuBLAS names it (set_gemm_precision), for the
// files that call cuBLAS or cuBLASLt (internal to kernels/cuda).
#pragma once

#include <cublas_api.h>

namespace strata::kernels::cuda {

cublasComputeType_t gemm_compute_type();

}  // namespace strata::kernels::cuda
