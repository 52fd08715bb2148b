// Dense matrix products through KokkosBlas. A product whose matrices are
// packed (leading dimension = width) is KokkosBlas::gemm on row-major views,
// which KokkosKernels hands to the vendor BLAS (the host BLAS, cuBLAS,
// rocBLAS) where it has one. A view cannot carry a leading dimension wider
// than the matrix except as LayoutStride, which only KokkosKernels' own gemm
// takes: on a host space with the BLAS the backend then calls KokkosKernels'
// host BLAS wrapper (the one its gemm uses) with the leading dimensions, and
// elsewhere KokkosBlas::gemm on strided views. KokkosBlas multiplies fp32
// only: 16-bit matrices go through a plain kernel of this backend, an output
// element per thread, its products summed in fp32 and rounded once.
#include <KokkosBlas3_gemm.hpp>
#include <KokkosKernels_config.h>
#if defined(KOKKOSKERNELS_ENABLE_TPL_BLAS)
#include <KokkosBlas_Host_tpl.hpp>
#endif

#include <type_traits>

#include "kernels/kokkos/kokkos_kernels.hpp"
#include "kernels/kokkos/views.hpp"

namespace strata::kernels::kokkos {

namespace {

using StridedMat = Kokkos::View<float**, Kokkos::LayoutStride, Mem, Unmanaged>;

StridedMat strided(const float* p, int rows, int cols, int ld) {
  return StridedMat(const_cast<float*>(p), Kokkos::LayoutStride(rows, ld, cols, 1));
}

// C = alpha op(A) op(B) + bias (per column; null: none) + beta C, summed in
// fp32 and rounded once into C's format.
template <typename E, typename EC>
void matmul_16(bool ta, bool tb, int M, int N, int K, float alpha, const E* A, int lda, const E* B, int ldb, float beta,
               EC* C, int ldc, const E* bias = nullptr) {
  Kokkos::parallel_for(
      "strata::matmul_16", Range(0, std::int64_t(M) * N), KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t i = idx / N, j = idx % N;
        float acc = 0.0f;
        for (std::int64_t k = 0; k < K; ++k)
          acc += to_float(A[ta ? k * lda + i : i * lda + k]) * to_float(B[tb ? j * ldb + k : k * ldb + j]);
        float v = alpha * acc;
        if (bias != nullptr) v += to_float(bias[j]);
        EC& c = C[i * ldc + j];
        c = from_float<EC>(beta == 0.0f ? v : v + beta * to_float(c));
      });
}

void matmul_f32(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                const float* B, int ldb, float beta, float* C, int ldc) {
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

}  // namespace

void matmul(bool trans_a, bool trans_b, int M, int N, int K, float alpha, core::CPtr A, int lda, core::CPtr B, int ldb,
            float beta, core::Ptr C, int ldc) {
  if (M == 0 || N == 0) return;
  if (A.precision() == core::Precision::fp32)
    return matmul_f32(trans_a, trans_b, M, N, K, alpha, A.f32(), lda, B.f32(), ldb, beta, C.f32(), ldc);
  STRATA_BY_FORMAT(A, {
    if constexpr (!std::is_same_v<E, float>) {
      if (C.precision() == core::Precision::fp32)
        matmul_16(trans_a, trans_b, M, N, K, alpha, A.as<E>(), lda, B.as<E>(), ldb, beta, C.f32(), ldc);
      else
        matmul_16(trans_a, trans_b, M, N, K, alpha, A.as<E>(), lda, B.as<E>(), ldb, beta, C.as<E>(), ldc);
    }
  });
}

void matmul_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, core::CPtr A, int lda,
                            std::int64_t stride_a, core::CPtr B, int ldb, std::int64_t stride_b, float beta,
                            core::Ptr C, int ldc, std::int64_t stride_c, int batch) {
  for (int i = 0; i < batch; ++i)
    matmul(trans_a, trans_b, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta, C + i * stride_c, ldc);
}

void linear_bias_forward(core::Ptr out, core::CPtr inp, core::CPtr w, core::CPtr bias, int N, int IC, int OC,
                         float beta) {
  if (out.precision() != core::Precision::fp32 && bias) {
    // The product and the bias summed in fp32 and rounded once.
    STRATA_BY_FORMAT(out, matmul_16(false, true, N, OC, IC, 1.0f, inp.as<E>(), IC, w.as<E>(), IC, beta, out.as<E>(), OC,
                                    bias.as<E>()));
    return;
  }
  matmul(false, true, N, OC, IC, 1.0f, inp, IC, w, IC, beta, out, OC);
  if (bias) bias_add(out, bias, N, OC);
}

}  // namespace strata::kernels::kokkos
