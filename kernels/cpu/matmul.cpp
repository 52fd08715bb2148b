// Dense matrix products on OpenBLAS (cblas_sgemm, row-major). Nearly all of a
// training step's FLOPs pass through here, so this file stays a thin wrapper:
// the only decision it makes is how to spread a batch of products over threads.
#include <cblas.h>
#include <omp.h>

#include <cstdint>

#include "kernels/cpu/cpu_kernels.hpp"

namespace strata::kernels::cpu {

void matmul(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
            int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha,
              A, lda, B, ldb, beta, C, ldc);
}

void matmul_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                            std::int64_t stride_a, const float* B, int ldb, std::int64_t stride_b, float beta, float* C,
                            int ldc, std::int64_t stride_c, int batch) {
  // Small products gain little from OpenBLAS's own threads (it synchronises on
  // every call), while the batch is embarrassingly parallel: hand whole
  // products to threads instead. Inside an active parallel region the OpenMP
  // build of OpenBLAS runs each call on the calling thread only.
  const int threads = omp_get_max_threads();
  const double flops = 2.0 * M * N * K;
  const bool over_batch = threads > 1 && !omp_in_parallel() && batch >= threads && flops < 64.0e6;
#pragma omp parallel for schedule(static) if (over_batch)
  for (int i = 0; i < batch; ++i) {
    matmul(trans_a, trans_b, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta, C + i * stride_c, ldc);
  }
}

void linear_bias_forward(float* out, const float* inp, const float* w, const float* bias, int N, int IC, int OC,
                         float beta) {
  matmul(false, true, N, OC, IC, 1.0f, inp, IC, w, IC, beta, out, OC);
  bias_add(out, bias, N, OC);
}

}  // namespace strata::kernels::cpu
