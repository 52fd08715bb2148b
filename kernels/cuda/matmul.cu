// GEMMs through cuBLAS, row-major as kernels.hpp states them: a row-major
// C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T, so cuBLAS is
// called with the operands swapped and no copy. fp32 math (cuBLAS's default
// mode; TF32 would change results beyond the tests' bound).
#include <cublas_v2.h>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"

namespace strata::kernels::cuda {

namespace {

#define STRATA_CHECK_CUBLAS(call, name)                                                      \
  do {                                                                                \
    const cublasStatus_t strata_cublas_rc = (call);                                   \
    if (strata_cublas_rc != CUBLAS_STATUS_SUCCESS)                                    \
      cublas_failed(name, int(strata_cublas_rc), __FILE__, __LINE__);                 \
  } while (0)

// One handle per process, created on first use.
cublasHandle_t handle() {
  static cublasHandle_t h = [] {
    cublasHandle_t x = nullptr;
    STRATA_CHECK_CUBLAS(cublasCreate(&x), "cublasCreate");
    return x;
  }();
  return h;
}

cublasOperation_t op(bool t) { return t ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace

void matmul(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
            int ldb, float beta, float* C, int ldc) {
  STRATA_CHECK_CUBLAS(cublasSgemm(handle(), op(trans_b), op(trans_a), N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc),
               "cublasSgemm");
}

void matmul_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                            std::int64_t stride_a, const float* B, int ldb, std::int64_t stride_b, float beta,
                            float* C, int ldc, std::int64_t stride_c, int batch) {
  STRATA_CHECK_CUBLAS(cublasSgemmStridedBatched(handle(), op(trans_b), op(trans_a), N, M, K, &alpha, B, ldb, stride_b, A,
                                         lda, stride_a, &beta, C, ldc, stride_c, batch),
               "cublasSgemmStridedBatched");
}

}  // namespace strata::kernels::cuda
