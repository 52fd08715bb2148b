// GEMMs through cuBLAS, row-major as kernels.hpp states them: a row-major
// C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T, so cuBLAS is
// called with the operands swapped and no copy. The operands' format is the
// GEMM's: fp32 in fp32 (TF32 would change results beyond the tests' bound),
// bf16 and fp16 on tensor cores, all with fp32 accumulation; C in the
// operands' format or fp32.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/check.hpp"
#include "kernels/foundation/clock.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/gemm.hpp"

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

void check_formats(core::CPtr A, core::CPtr B, core::CPtr C) {
  const core::Precision p = A.precision();
  if (B.precision() != p || (C.precision() != p && C.precision() != core::Precision::fp32))
    formats_refused("matmul", p, B.precision(), C.precision());
}

}  // namespace

cudaDataType_t cuda_type(core::Precision p) {
  return p == core::Precision::bf16 ? CUDA_R_16BF : p == core::Precision::fp16 ? CUDA_R_16F : CUDA_R_32F;
}

void matmul(bool trans_a, bool trans_b, int M, int N, int K, float alpha, core::CPtr A, int lda, core::CPtr B,
            int ldb, float beta, core::Ptr C, int ldc) {
  check_formats(A, B, C);
  if (M == 0 || N == 0) return;
  STRATA_CHECK_CUBLAS(cublasGemmEx(handle(), op(trans_b), op(trans_a), N, M, K, &alpha, B.get(),
                                   cuda_type(B.precision()), ldb, A.get(), cuda_type(A.precision()), lda, &beta, C.get(),
                                   cuda_type(C.precision()), ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                      "cublasGemmEx");
}

void matmul_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, core::CPtr A, int lda,
                            std::int64_t stride_a, core::CPtr B, int ldb, std::int64_t stride_b, float beta,
                            core::Ptr C, int ldc, std::int64_t stride_c, int batch) {
  check_formats(A, B, C);
  STRATA_CHECK_CUBLAS(cublasGemmStridedBatchedEx(handle(), op(trans_b), op(trans_a), N, M, K, &alpha, B.get(),
                                                 cuda_type(B.precision()), ldb, stride_b, A.get(),
                                                 cuda_type(A.precision()), lda, stride_a, &beta, C.get(),
                                                 cuda_type(C.precision()), ldc, stride_c, batch, CUBLAS_COMPUTE_32F,
                                                 CUBLAS_GEMM_DEFAULT),
                      "cublasGemmStridedBatchedEx");
}

namespace {
// Values in [-1, 1) from a hash of the index: a GEMM of zeros runs faster
// than one of real data (the tensor cores' switching power).
__global__ void fill_hashed(void* x, std::int64_t n, int bytes_per_element) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    std::uint32_t h = std::uint32_t(i) * 2654435761u;
    h ^= h >> 15;
    const float v = float(h & 0xffffu) / 32768.0f - 1.0f;
    if (bytes_per_element == 4)
      static_cast<float*>(x)[i] = v;
    else  // bf16 and fp16 alike: the top half of this fp32 pattern is a finite value in either
      static_cast<std::uint16_t*>(x)[i] = std::uint16_t(__float_as_uint(v * 0.01f) >> 16);
  }
}
}  // namespace

double measure_gemm_flops(int n, int reps, core::Precision p) {
  const bool half = p != core::Precision::fp32;
  const std::size_t elems = std::size_t(n) * std::size_t(n), bytes = elems * (half ? 2 : 4);
  void* a = malloc_device(bytes);
  void* b = malloc_device(bytes);
  void* c = malloc_device(bytes);
  for (void* x : {a, b}) {
    fill_hashed<<<1024, 256>>>(x, std::int64_t(elems), half ? 2 : 4);
    STRATA_CHECK_LAUNCH();
  }
  const float one = 1.0f, zero = 0.0f;
  const cudaDataType_t t = p == core::Precision::bf16 ? CUDA_R_16BF : p == core::Precision::fp16 ? CUDA_R_16F : CUDA_R_32F;
  auto gemm = [&] {
    STRATA_CHECK_CUBLAS(cublasGemmEx(handle(), CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, t, n, b, t, n, &zero, c, t,
                                     n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                        "cublasGemmEx");
  };
  // The first call (untimed) makes the handle's workspace and the kernel's first launch.
  const double best = prof::best_rate(2.0 * double(n) * double(n) * double(n), reps, [&] {
    gemm();
    synchronize();
  });
  free_device(a);
  free_device(b);
  free_device(c);
  return best;
}

}  // namespace strata::kernels::cuda
