// Dense matrix products. Nearly all of a training step's FLOPs pass through
// here. fp32 goes to OpenBLAS (cblas_sgemm, row-major). 16-bit matrices go to
// oneDNN's bf16 matmul where the processor has bf16 instructions
// (onednn.cpp); elsewhere (and for fp16, which oneDNN 2.6 multiplies on no
// processor without AVX512-FP16) they are widened to fp32 a tile at a time
// and multiplied by sgemm, the result rounded once per element. Either way
// the products accumulate in fp32.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/onednn.hpp"
#include "kernels/foundation/error.hpp"

namespace strata::kernels::cpu {

namespace {

using core::CPtr;
using core::Precision;
using core::Ptr;

void sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
           float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}

// The widening path's tiles: C in kTile x kTile blocks, K in slices of
// kTile, each operand's tile widened into per-thread fp32 scratch (3 x 256
// KiB: fixed, whatever the shapes) before sgemm multiplies it.
constexpr int kTile = 256;

float* tile_scratch() {
  thread_local std::vector<float> s(3 * std::size_t(kTile) * kTile);
  return s.data();
}

// dst[r, c] = widen(op(src)[r0 + r, c0 + c]) for an rows x cols tile, op
// transposing a matrix stored with leading dimension ld.
template <typename E>
void widen_tile(float* dst, const E* src, std::int64_t ld, bool trans, int r0, int c0, int rows, int cols) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const std::int64_t i = trans ? std::int64_t(c0 + c) * ld + (r0 + r) : std::int64_t(r0 + r) * ld + (c0 + c);
      dst[std::int64_t(r) * cols + c] = core::to_float(src[i]);
    }
}

template <typename E, typename EC>
void widened_matmul(bool ta, bool tb, int M, int N, int K, float alpha, const E* A, int lda, const E* B, int ldb,
                    float beta, EC* C, int ldc) {
  float* a = tile_scratch();
  float* b = a + kTile * kTile;
  float* c = b + kTile * kTile;
  for (int i0 = 0; i0 < M; i0 += kTile)
    for (int j0 = 0; j0 < N; j0 += kTile) {
      const int mb = std::min(kTile, M - i0), nb = std::min(kTile, N - j0);
      for (int i = 0; i < mb; ++i)
        for (int j = 0; j < nb; ++j)
          c[i * nb + j] = beta == 0.0f ? 0.0f : beta * core::to_float(C[std::int64_t(i0 + i) * ldc + j0 + j]);
      for (int k0 = 0; k0 < K; k0 += kTile) {
        const int kb = std::min(kTile, K - k0);
        widen_tile(a, A, lda, ta, i0, k0, mb, kb);
        widen_tile(b, B, ldb, tb, k0, j0, kb, nb);
        sgemm(false, false, mb, nb, kb, alpha, a, kb, b, nb, 1.0f, c, nb);
      }
      for (int i = 0; i < mb; ++i)
        for (int j = 0; j < nb; ++j) C[std::int64_t(i0 + i) * ldc + j0 + j] = core::from_float<EC>(c[i * nb + j]);
    }
}

}  // namespace

void matmul(bool trans_a, bool trans_b, int M, int N, int K, float alpha, CPtr A, int lda, CPtr B, int ldb, float beta,
            Ptr C, int ldc) {
  const Precision p = A.precision();
  STRATA_CHECK(B.precision() == p && (C.precision() == p || C.precision() == Precision::fp32),
               "matmul of {} and {} into {}", core::precision_name(p), core::precision_name(B.precision()),
               core::precision_name(C.precision()));
  if (M == 0 || N == 0) return;
  if (p == Precision::fp32) return sgemm(trans_a, trans_b, M, N, K, alpha, A.f32(), lda, B.f32(), ldb, beta, C.f32(), ldc);
  if (K > 0 && onednn_gemm(p))
    return onednn_matmul(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  STRATA_BY_FORMAT(A, {
    if (C.precision() == Precision::fp32)
      widened_matmul(trans_a, trans_b, M, N, K, alpha, A.as<E>(), lda, B.as<E>(), ldb, beta, C.f32(), ldc);
    else
      widened_matmul(trans_a, trans_b, M, N, K, alpha, A.as<E>(), lda, B.as<E>(), ldb, beta, C.as<E>(), ldc);
  });
}

void matmul_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, CPtr A, int lda,
                            std::int64_t stride_a, CPtr B, int ldb, std::int64_t stride_b, float beta, Ptr C, int ldc,
                            std::int64_t stride_c, int batch) {
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

void linear_bias_forward(Ptr out, CPtr inp, CPtr w, CPtr bias, int N, int IC, int OC, float beta) {
  if (out.precision() == Precision::fp32 || !bias) {
    matmul(false, true, N, OC, IC, 1.0f, inp, IC, w, IC, beta, out, OC);
    if (bias) bias_add(out, bias, N, OC);
    return;
  }
  // 16-bit: the product and the bias are summed in fp32 and rounded once,
  // a block of rows at a time, through per-thread scratch.
  constexpr int kRows = 256;
  thread_local std::vector<float> rows, wide_bias;
  rows.resize(std::size_t(kRows) * OC);
  wide_bias.resize(std::size_t(OC));
  convert(wide_bias.data(), bias, OC);
  for (int r0 = 0; r0 < N; r0 += kRows) {
    const int nr = std::min(kRows, N - r0);
    Ptr block = out + std::int64_t(r0) * OC;
    if (beta != 0.0f) convert(rows.data(), block, std::int64_t(nr) * OC);
    matmul(false, true, nr, OC, IC, 1.0f, inp + std::int64_t(r0) * IC, IC, w, IC, beta, rows.data(), OC);
    bias_add(rows.data(), wide_bias.data(), nr, OC);
    convert(block, rows.data(), std::int64_t(nr) * OC);
  }
}

}  // namespace strata::kernels::cpu
