// GEMMs through cuBLAS, row-major as kernels.hpp states them: a row-major
// C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T, so cuBLAS is
// called with the operands swapped and no copy. fp32 math by default (TF32
// would change results beyond the tests' bound); under bf16 mixed precision
// the inputs are rounded to bf16 and multiplied on tensor cores with fp32
// accumulation (CUBLAS_COMPUTE_32F_FAST_16BF), autocast's arithmetic with
// fp32 storage.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>

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

cublasComputeType_t g_compute = CUBLAS_COMPUTE_32F;

}  // namespace

void set_gemm_precision(core::Precision p) {
  g_compute = p == core::Precision::bf16   ? CUBLAS_COMPUTE_32F_FAST_16BF
              : p == core::Precision::fp16 ? CUBLAS_COMPUTE_32F_FAST_16F
                                           : CUBLAS_COMPUTE_32F;
}

void matmul(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
            int ldb, float beta, float* C, int ldc) {
  STRATA_CHECK_CUBLAS(cublasGemmEx(handle(), op(trans_b), op(trans_a), N, M, K, &alpha, B, CUDA_R_32F, ldb, A,
                                   CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc, g_compute, CUBLAS_GEMM_DEFAULT),
                      "cublasGemmEx");
}

void matmul_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                            std::int64_t stride_a, const float* B, int ldb, std::int64_t stride_b, float beta,
                            float* C, int ldc, std::int64_t stride_c, int batch) {
  STRATA_CHECK_CUBLAS(cublasGemmStridedBatchedEx(handle(), op(trans_b), op(trans_a), N, M, K, &alpha, B, CUDA_R_32F,
                                                 ldb, stride_b, A, CUDA_R_32F, lda, stride_a, &beta, C, CUDA_R_32F, ldc,
                                                 stride_c, batch, g_compute, CUBLAS_GEMM_DEFAULT),
                      "cublasGemmStridedBatchedEx");
}

double measure_gemm_flops(int n, int reps, bool bf16) {
  const std::size_t elems = std::size_t(n) * std::size_t(n), bytes = elems * (bf16 ? 2 : 4);
  void* a = malloc_device(bytes);
  void* b = malloc_device(bytes);
  void* c = malloc_device(bytes);
  zero_bytes(a, bytes);  // the rate does not depend on the values
  zero_bytes(b, bytes);
  const float one = 1.0f, zero = 0.0f;
  const cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  auto gemm = [&] {
    STRATA_CHECK_CUBLAS(cublasGemmEx(handle(), CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, t, n, b, t, n, &zero, c, t,
                                     n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                        "cublasGemmEx");
  };
  gemm();  // warm-up: the handle's workspace and the kernel's first launch
  synchronize();
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    gemm();
    synchronize();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * double(n) * double(n) * double(n) / dt);
  }
  free_device(a);
  free_device(b);
  free_device(c);
  return best;
}

}  // namespace strata::kernels::cuda
