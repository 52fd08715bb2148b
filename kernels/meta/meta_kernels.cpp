// Each operation's cost, from its shape arguments: FLOPs of matrix products
// (the GEMMs and attention's two products, counted as the model's FLOPs
// count them: 2 m n k, attention over the full T x T square) apart from all
// other FLOPs (per element, the operation's arithmetic), and the bytes of its
// inputs read and its outputs written once (4 per fp32 element, 2 per
// 16-bit one; a read-modify-write output counts twice). The state of
// attention is counted as its fused form, the rows' log-sum-exp.
#include "kernels/meta/meta_kernels.hpp"

#include <algorithm>

#include "kernels/kernels.hpp"

namespace strata::kernels::meta {

namespace {
using i64 = std::int64_t;
constexpr double F = 4;  // bytes of an fp32 element
// `name` is the operation's (kernels/ops.inc); m, n, k a matrix product's shape.
void count(const char* name, double matmul_flops, double other_flops, double bytes, int m = 0, int n = 0, int k = 0) {
  count_meta_cost(name, matmul_flops, other_flops, bytes, m, n, k);
}
double gemm_bytes(i64 M, i64 N, i64 K, float beta) { return F * double(M * K + K * N + M * N * (beta != 0 ? 2 : 1)); }
}  // namespace

void matmul(bool, bool, int M, int N, int K, float, const float*, int, const float*, int, float beta, float*, int) {
  count(__func__, 2.0 * M * N * K, 0, gemm_bytes(M, N, K, beta), M, N, K);
}

void matmul_strided_batched(bool, bool, int M, int N, int K, float, const float*, int, i64, const float*, int, i64,
                            float beta, float*, int, i64, int batch) {
  count(__func__, 2.0 * M * N * K * batch, 0, gemm_bytes(M, N, K, beta) * batch, M, N, K);
}

void linear_bias_forward(float*, const float*, const float*, const float*, int N, int IC, int OC, float beta) {
  count(__func__, 2.0 * N * IC * OC, double(N) * OC, gemm_bytes(N, OC, IC, beta) + F * OC, N, OC, IC);
}

void bias_add(float*, const float*, int N, int C) { count(__func__, 0, double(N) * C, F * (2.0 * N * C + C)); }
void bias_backward(float*, const float*, int N, int C) { count(__func__, 0, double(N) * C, F * (double(N) * C + 2.0 * C)); }

void layernorm_forward(float*, float*, float*, const float*, const float*, const float*, int N, int C, float) {
  count(__func__, 0, 8.0 * N * C, F * (2.0 * N * C + 2.0 * C + 2.0 * N));
}
void layernorm_backward(float*, float*, float*, const float*, const float*, const float*, const float*,
                        const float*, int N, int C) {
  count(__func__, 0, 14.0 * N * C, F * (4.0 * N * C + 5.0 * C + 2.0 * N));
}

void rmsnorm_forward(float*, float*, const float*, const float*, int N, int C, float) {
  count(__func__, 0, 4.0 * N * C, F * (2.0 * N * C + C + N));
}
void rmsnorm_backward(float*, float*, const float*, const float*, const float*, const float*, int N, int C) {
  count(__func__, 0, 10.0 * N * C, F * (4.0 * N * C + 3.0 * C + N));
}
// A pair turns in 6 FLOPs; the angles (per row and pair) are not counted.
void rope_forward(float*, int B, int T, i64, int heads, int hs, int, float) {
  const double n = double(B) * T * heads * hs;
  count(__func__, 0, 3.0 * n, F * 2.0 * n);
}
void rope_backward(float*, int B, int T, i64, int heads, int hs, int, float) {
  const double n = double(B) * T * heads * hs;
  count(__func__, 0, 3.0 * n, F * 2.0 * n);
}
void swiglu_forward(float*, const float*, int N, int Fw) { count(__func__, 0, 6.0 * N * Fw, F * 3.0 * N * Fw); }
void swiglu_backward(float*, const float*, const float*, int N, int Fw) {
  count(__func__, 0, 12.0 * N * Fw, F * 7.0 * N * Fw);
}

void gelu_forward(float*, const float*, i64 n) { count(__func__, 0, 12.0 * n, F * 2.0 * n); }
void gelu_backward(float*, const float*, const float*, i64 n) { count(__func__, 0, 18.0 * n, F * 4.0 * n); }
void residual_forward(float*, const float*, const float*, i64 n) { count(__func__, 0, double(n), F * 3.0 * n); }
void add_inplace(float*, const float*, i64 n) { count(__func__, 0, double(n), F * 3.0 * n); }
void scale_inplace(float*, float, i64 n) { count(__func__, 0, double(n), F * 2.0 * n); }
void fill_zero(float*, i64 n) { count(__func__, 0, 0, F * double(n)); }
double sum_squares(const float*, i64 n) {
  count(__func__, 0, 2.0 * n, F * double(n));
  return 0;
}

// Grouped-query attention reads KVC = NKV C / NH columns each of k and v:
// a qkv row is W = C + 2 KVC wide; the products are the query heads'.
void attention_forward(float*, float*, const float*, int B, int T, int C, int NH, int NKV) {
  const double scores = double(B) * NH * T * T, W = C + 2.0 * C / NH * NKV;
  count(__func__, 4.0 * B * T * double(T) * C, 5.0 * scores, F * (double(B) * T * (W + C) + double(B) * NH * T));
}
void attention_backward(float*, float*, const float*, const float*, const float*, const float*, int B, int T, int C,
                        int NH, int NKV) {
  const double scores = double(B) * NH * T * T, W = C + 2.0 * C / NH * NKV;
  count(__func__, 8.0 * B * T * double(T) * C, 8.0 * scores,
        F * (double(B) * T * (2 * W + 4.0 * C) + 2.0 * B * NH * T));
}

// A ring block counts as the model counts attention: every (query, key)
// pair of the causal square, twice the pairs it attends; so the blocks of a
// ring add up to one rank's whole-sequence figure.
namespace {
double attended_pairs(int Tq, int Tk, int q0, int k0) {
  double pairs = 0;
  for (int i = 0; i < Tq; ++i) pairs += std::clamp(q0 + i - k0 + 1, 0, Tk);
  return pairs;
}
}  // namespace

void attention_block_forward(float*, float*, const float*, const float*, int B, int Tq, int Tk, int C, int NH, int NKV,
                             i64, i64, int q0, int k0, bool accumulate) {
  const double pairs = 2 * attended_pairs(Tq, Tk, q0, k0), KVC = double(C) / NH * NKV;
  count(__func__, 4.0 * B * pairs * C, 5.0 * B * NH * pairs,
        F * (double(B) * Tq * C * (accumulate ? 3 : 2) + 2.0 * B * Tk * KVC + double(B) * NH * Tq * (accumulate ? 2 : 1)));
}
void attention_block_backward(float*, float*, const float*, const float*, const float*, const float*, const float*,
                              int B, int Tq, int Tk, int C, int NH, int NKV, i64, i64, int q0, int k0) {
  const double pairs = 2 * attended_pairs(Tq, Tk, q0, k0), KVC = double(C) / NH * NKV;
  count(__func__, 8.0 * B * pairs * C, 8.0 * B * NH * pairs,
        F * (double(B) * Tq * C * 6 + 4.0 * B * Tk * KVC + double(B) * NH * Tq));
}
void copy_rows(float*, i64, const float*, i64, i64 rows, i64 cols, bool add) {
  count(__func__, 0, add ? double(rows) * cols : 0, F * double(rows) * cols * (add ? 3 : 2));
}

void embedding_forward(float*, const std::int32_t*, const float*, const float* wpe, int B, int T, int C, int, int) {
  const double n = double(B) * T * C;
  count(__func__, 0, wpe != nullptr ? n : 0, F * (n * (wpe != nullptr ? 3 : 2)) + 4.0 * B * T);
}
void embedding_backward(float*, float* dwpe, const float*, const std::int32_t*, int B, int T, int C, int, int) {
  const double n = double(B) * T * C;
  count(__func__, 0, n * (dwpe != nullptr ? 2 : 1), F * n * (dwpe != nullptr ? 5 : 3) + 4.0 * B * T);
}
void add_position_rows(float*, const float*, int rows, int C, int, int) {
  count(__func__, 0, double(rows) * C, F * 3.0 * rows * C);
}

void softmax_cross_entropy_forward(float*, const float*, const std::int32_t*, int N, int V) {
  count(__func__, 0, 4.0 * N * V, F * (double(N) * V + N) + 4.0 * N);
}
void softmax_cross_entropy_backward(float*, const float*, const std::int32_t*, float, int N, int V) {
  count(__func__, 0, 4.0 * N * V, F * 2.0 * N * V + 4.0 * N);
}
void row_max(float*, const float*, int N, int V) { count(__func__, 0, double(N) * V, F * (double(N) * V + N)); }
void row_exp_sum(float*, const float*, const float*, int N, int V) {
  count(__func__, 0, 3.0 * N * V, F * (double(N) * V + 2.0 * N));
}
void pick_target_logits(float*, const float*, const std::int32_t*, int, int N, int) { count(__func__, 0, 0, F * 2.0 * N + 4.0 * N); }
void cross_entropy_from_parts(float*, const float*, const float*, const float*, int N) {
  count(__func__, 0, 3.0 * N, F * 4.0 * N);
}
void softmax_cross_entropy_backward_sharded(float*, const float*, const float*, const float*, const std::int32_t*,
                                            int, float, int N, int V) {
  count(__func__, 0, 4.0 * N * V, F * (2.0 * N * V + 2.0 * N) + 4.0 * N);
}

void widen(float*, const std::uint16_t*, i64 n, core::Precision) { count(__func__, 0, double(n), 6.0 * n); }
void narrow(std::uint16_t*, const float*, i64 n, core::Precision) { count(__func__, 0, double(n), 6.0 * n); }
void narrow_add(std::uint16_t*, const float*, i64 n, core::Precision) { count(__func__, 0, 2.0 * n, 8.0 * n); }
void add_half(std::uint16_t*, const std::uint16_t*, i64 n, core::Precision) { count(__func__, 0, 3.0 * n, 6.0 * n); }
double sum_squares_half(const std::uint16_t*, i64 n, core::Precision) {
  count(__func__, 0, 3.0 * n, 2.0 * n);
  return 0;
}
double sum_squares_tensors(const void* const*, const i64* ns, const double*, int count_, core::Precision p) {
  double n = 0;
  for (int k = 0; k < count_; ++k) n += double(ns[k]);
  count(__func__, 0, 2.0 * n, n * core::element_bytes(p));
  return 0;
}
void adamw_update_mixed(float*, std::uint16_t*, const std::uint16_t*, float, float*, float*, i64 n, float, float,
                        float, float, float, int, core::Precision) {
  // master, m, v read and written; the 16-bit gradient read, the parameter written.
  count(__func__, 0, 16.0 * n, (6 * F + 4) * double(n));
}
void adamw_update(float*, const float*, float*, float*, i64 n, float, float, float, float, float, int) {
  // param, m, v read and written, the gradient read.
  count(__func__, 0, 14.0 * n, 7 * F * double(n));
}

}  // namespace strata::kernels::meta
