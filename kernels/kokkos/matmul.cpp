// Dense matrix products through KokkosBlas. A product whose matrices are
// packed (leading dimension = width) is KokkosBlas::gemm on row-major views,
// which KokkosKernels hands to the vendor BLAS (the host BLAS, cuBLAS,
// rocBLAS) where it has one. A view cannot carry a leading dimension wider
// than the matrix except as LayoutStride, which only KokkosKernels' own gemm
// takes: on a host space with the BLAS the backend then calls KokkosKernels'
// host BLAS wrapper (the one its gemm uses) with the leading dimensions, and
// elsewhere KokkosBlas::gemm on strided views.
#include <KokkosBlas3_gemm.hpp>
#include <KokkosKernels_config.h>
#if defined(KOKKOSKERNELS_ENABLE_TPL_BLAS)
#include <KokkosBlas_Host_tpl.hpp>
#endif

#include "kernels/kokkos/kokkos_kernels.hpp"
#include "kernels/kokkos/views.hpp"

namespace strata::kernels::kokkos {

namespace {

using StridedMat = Kokkos::View<float**, Kokkos::LayoutStride, Mem, Unmanaged>;

StridedMat strided(const float* p, int rows, int cols, int ld) {
  return StridedMat(const_cast<float*>(p), Kokkos::LayoutStride(rows, ld, cols, 1));
}

}  // namespace

void matmul(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
            int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  // A is stored a_rows x a_cols (K x M when transposed), B b_rows x b_cols.
  const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  const char* ta = trans_a ? "T" : "N";
  const char* tb = trans_b ? "T" : "N";
  if (lda == a_cols && ldb == b_cols && ldc == N) {
    const Mat<const float> a(A, a_rows, a_cols), b(B, b_rows, b_cols);
    const Mat<float> c(C, M, N);
    KokkosBlas::gemm(ta, tb, alpha, a, b, beta, c);
    return;
  }
#if defined(KOKKOSKERNELS_ENABLE_TPL_BLAS)
  if constexpr (kHostMemory) {
    // Column-major BLAS on row-major data: C^T = op(B)^T op(A)^T.
    KokkosBlas::Impl::HostBlas<float>::gemm(*tb, *ta, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc);
    return;
  }
#endif
  KokkosBlas::gemm(ta, tb, alpha, strided(A, a_rows, a_cols, lda), strided(B, b_rows, b_cols, ldb), beta,
                   strided(C, M, N, ldc));
}

void matmul_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                            std::int64_t stride_a, const float* B, int ldb, std::int64_t stride_b, float beta, float* C,
                            int ldc, std::int64_t stride_c, int batch) {
  for (int i = 0; i < batch; ++i)
    matmul(trans_a, trans_b, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta, C + i * stride_c, ldc);
}

void linear_bias_forward(float* out, const float* inp, const float* w, const float* bias, int N, int IC, int OC,
                         float beta) {
  matmul(false, true, N, OC, IC, 1.0f, inp, IC, w, IC, beta, out, OC);
  bias_add(out, bias, N, OC);
}

}  // namespace strata::kernels::kokkos
