// Each operation's cost, from its shape arguments: FLOPs of matrix products
// (the GEMMs and attention's two products, counted as the model's FLOPs
// count them: 2 m n k, attention over the full T x T square) apart from all
// other FLOPs (per element, the operation's arithmetic), and the bytes of its
// inputs read and its outputs written once (4 per fp32 element, 2 per
// 16-bit one, each tensor at its own format; a read-modify-write output
// counts twice). The state of attention is counted as its fused form, the
// rows' log-sum-exp.
#include "kernels/meta/meta_kernels.hpp"

#include <algorithm>

#include "kernels/kernels.hpp"

namespace strata::kernels::meta {

namespace {
using core::CPtr;
using core::Ptr;
using i64 = std::int64_t;
constexpr double F = 4;  // bytes of an fp32 element
// Bytes of one element of a tensor's format.
double bytes_of(CPtr x) { return x.element_bytes(); }
// `name` is the operation's (kernels/ops.inc); m, n, k a matrix product's shape.
void count(const char* name, double matmul_flops, double other_flops, double bytes, int m = 0, int n = 0, int k = 0) {
  count_meta_cost(name, matmul_flops, other_flops, bytes, m, n, k);
}
double gemm_bytes(i64 M, i64 N, i64 K, float beta, double ab, double c) {
  return ab * double(M * K + K * N) + c * double(M * N * (beta != 0 ? 2 : 1));
}
}  // namespace

void matmul(bool, bool, int M, int N, int K, float, CPtr A, int, CPtr, int, float beta, Ptr C, int) {
  count(__func__, 2.0 * M * N * K, 0, gemm_bytes(M, N, K, beta, bytes_of(A), bytes_of(C)), M, N, K);
}

void matmul_strided_batched(bool, bool, int M, int N, int K, float, CPtr A, int, i64, CPtr, int, i64, float beta,
                            Ptr C, int, i64, int batch) {
  count(__func__, 2.0 * M * N * K * batch, 0, gemm_bytes(M, N, K, beta, bytes_of(A), bytes_of(C)) * batch, M, N, K);
}

void linear_bias_forward(Ptr out, CPtr, CPtr, CPtr, int N, int IC, int OC, float beta) {
  const double a = bytes_of(out);
  count(__func__, 2.0 * N * IC * OC, double(N) * OC, gemm_bytes(N, OC, IC, beta, a, a) + a * OC, N, OC, IC);
}

void bias_add(Ptr out, CPtr, int N, int C) { count(__func__, 0, double(N) * C, bytes_of(out) * (2.0 * N * C + C)); }
void bias_backward(float*, CPtr dout, int N, int C) {
  count(__func__, 0, double(N) * C, bytes_of(dout) * double(N) * C + F * 2.0 * C);
}

void layernorm_forward(Ptr out, float*, float*, CPtr, CPtr, CPtr, int N, int C, float) {
  count(__func__, 0, 8.0 * N * C, bytes_of(out) * (2.0 * N * C + 2.0 * C) + F * 2.0 * N);
}
void layernorm_backward(Ptr dinp, float*, float*, CPtr, CPtr, CPtr, const float*, const float*, int N, int C) {
  count(__func__, 0, 14.0 * N * C, bytes_of(dinp) * (4.0 * N * C + C) + F * (4.0 * C + 2.0 * N));
}

void rmsnorm_forward(Ptr out, float*, CPtr, CPtr, int N, int C, float) {
  count(__func__, 0, 4.0 * N * C, bytes_of(out) * (2.0 * N * C + C) + F * N);
}
void rmsnorm_backward(Ptr dinp, float*, CPtr, CPtr, CPtr, const float*, int N, int C) {
  count(__func__, 0, 10.0 * N * C, bytes_of(dinp) * (4.0 * N * C + C) + F * (2.0 * C + N));
}
// A pair turns in 6 FLOPs; the angles (per row and pair) are not counted.
void rope_forward(Ptr x, int B, int T, i64, int heads, int hs, int, float) {
  const double n = double(B) * T * heads * hs;
  count(__func__, 0, 3.0 * n, bytes_of(x) * 2.0 * n);
}
void rope_backward(Ptr dx, int B, int T, i64, int heads, int hs, int, float) {
  const double n = double(B) * T * heads * hs;
  count(__func__, 0, 3.0 * n, bytes_of(dx) * 2.0 * n);
}
void swiglu_forward(Ptr out, CPtr, int N, int Fw) { count(__func__, 0, 6.0 * N * Fw, bytes_of(out) * 3.0 * N * Fw); }
void swiglu_backward(Ptr dinp, CPtr, CPtr, int N, int Fw) {
  count(__func__, 0, 12.0 * N * Fw, bytes_of(dinp) * 7.0 * N * Fw);
}

void gelu_forward(Ptr out, CPtr, i64 n) { count(__func__, 0, 12.0 * n, bytes_of(out) * 2.0 * n); }
void gelu_backward(Ptr dinp, CPtr, CPtr, i64 n) { count(__func__, 0, 18.0 * n, bytes_of(dinp) * 4.0 * n); }
void residual_forward(Ptr out, CPtr, CPtr, i64 n) { count(__func__, 0, double(n), bytes_of(out) * 3.0 * n); }
void add_inplace(Ptr y, CPtr x, i64 n) { count(__func__, 0, double(n), (2 * bytes_of(y) + bytes_of(x)) * double(n)); }
void scale_inplace(Ptr x, float, i64 n) { count(__func__, 0, double(n), bytes_of(x) * 2.0 * n); }
void fill_zero(Ptr x, i64 n) { count(__func__, 0, 0, bytes_of(x) * double(n)); }
void convert(Ptr y, CPtr x, i64 n) { count(__func__, 0, double(n), (bytes_of(y) + bytes_of(x)) * double(n)); }
double sum_squares(CPtr x, i64 n) {
  count(__func__, 0, 2.0 * n, bytes_of(x) * double(n));
  return 0;
}

// Grouped-query attention reads KVC = NKV C / NH columns each of k and v:
// a qkv row is W = C + 2 KVC wide; the products are the query heads'.
void attention_forward(Ptr out, Ptr, CPtr, int B, int T, int C, int NH, int NKV) {
  const double scores = double(B) * NH * T * T, W = C + 2.0 * C / NH * NKV;
  count(__func__, 4.0 * B * T * double(T) * C, 5.0 * scores,
        bytes_of(out) * double(B) * T * (W + C) + F * double(B) * NH * T);
}
void attention_backward(Ptr dqkv, Ptr, CPtr, CPtr, CPtr, CPtr, int B, int T, int C, int NH, int NKV) {
  const double scores = double(B) * NH * T * T, W = C + 2.0 * C / NH * NKV;
  count(__func__, 8.0 * B * T * double(T) * C, 8.0 * scores,
        bytes_of(dqkv) * double(B) * T * (2 * W + 4.0 * C) + F * 2.0 * B * NH * T);
}

// The materialised scores: every row read and written whole (a masked
// square, as Megatron-LM's softmax kernel reads and writes it).
void causal_softmax_forward(Ptr p, i64 matrices, int T) {
  const double square = double(matrices) * T * T;
  count(__func__, 0, 2.5 * square, bytes_of(p) * 2 * square);
}
void causal_softmax_backward(Ptr dp, CPtr, i64 matrices, int T) {
  const double square = double(matrices) * T * T;
  count(__func__, 0, 2.0 * square, bytes_of(dp) * 3 * square);
}

// A ring block counts as the model counts attention: every (query, key)
// pair of the causal square, twice the pairs it attends; so the blocks of a
// ring add up to one rank's whole-sequence figure.
namespace {
// The (query, key) pairs a causal block attends: query q0 + i sees keys
// k0 .. q0 + i of the block's Tk, so row i counts clamp(d + i, 0, Tk) with
// d = q0 - k0 + 1. In closed form (the estimate calls this per block, layer
// and micro-batch): rows before -d see none, then one more key a row up to
// Tk - d, then all Tk. Exact in double (fewer than 2^53 pairs).
double attended_pairs(int Tq, int Tk, int q0, int k0) {
  const std::int64_t d = std::int64_t(q0) - k0 + 1;
  const std::int64_t first = std::max<std::int64_t>(0, -d);                 // the first row that sees a key...
  const std::int64_t full = std::min<std::int64_t>(std::max<std::int64_t>(Tk - d, first), Tq);  // ...all Tk
  const std::int64_t growing = std::max<std::int64_t>(0, full - first);
  // Rows first .. full - 1 see d + first, d + first + 1, ... keys.
  const double ramp = double(growing) * double(d + first) + double(growing) * double(growing - 1) / 2;
  return ramp + double(std::max<std::int64_t>(0, Tq - std::max(full, first))) * Tk;
}
}  // namespace

void attention_block_forward(Ptr out, float*, CPtr, CPtr, int B, int Tq, int Tk, int C, int NH, int NKV, i64, i64,
                             int q0, int k0, bool accumulate) {
  const double pairs = 2 * attended_pairs(Tq, Tk, q0, k0), KVC = double(C) / NH * NKV, a = bytes_of(out);
  count(__func__, 4.0 * B * pairs * C, 5.0 * B * NH * pairs,
        a * (double(B) * Tq * C * (accumulate ? 3 : 2) + 2.0 * B * Tk * KVC) +
            F * double(B) * NH * Tq * (accumulate ? 2 : 1));
}
void attention_block_backward(Ptr dq, Ptr dkv, CPtr q, CPtr, CPtr, CPtr, const float*, int B, int Tq, int Tk, int C,
                              int NH, int NKV, i64, i64, int q0, int k0) {
  const double pairs = 2 * attended_pairs(Tq, Tk, q0, k0), KVC = double(C) / NH * NKV, a = bytes_of(q);
  count(__func__, 8.0 * B * pairs * C, 8.0 * B * NH * pairs,
        a * (double(B) * Tq * C * 4 + 2.0 * B * Tk * KVC) + bytes_of(dq) * 2.0 * B * Tq * C +
            bytes_of(dkv) * 2.0 * B * Tk * KVC + F * double(B) * NH * Tq);
}
void copy_rows(Ptr dst, i64, CPtr src, i64, i64 rows, i64 cols, bool add) {
  count(__func__, 0, add ? double(rows) * cols : 0,
        double(rows) * cols * (bytes_of(src) + bytes_of(dst) * (add ? 2 : 1)));
}

void embedding_forward(Ptr out, const std::int32_t*, CPtr, CPtr wpe, int B, int T, int C, int, int) {
  const double n = double(B) * T * C;
  count(__func__, 0, wpe ? n : 0, bytes_of(out) * (n * (wpe ? 3 : 2)) + 4.0 * B * T);
}
void embedding_backward(float*, float* dwpe, CPtr dout, const std::int32_t*, int B, int T, int C, int, int) {
  const double n = double(B) * T * C;
  count(__func__, 0, n * (dwpe != nullptr ? 2 : 1), bytes_of(dout) * n + F * n * (dwpe != nullptr ? 4 : 2) + 4.0 * B * T);
}
void add_position_rows(Ptr out, CPtr, int rows, int C, int, int) {
  count(__func__, 0, double(rows) * C, bytes_of(out) * 3.0 * rows * C);
}

void softmax_cross_entropy_forward(float*, CPtr logits, const std::int32_t*, int N, int V) {
  count(__func__, 0, 4.0 * N * V, bytes_of(logits) * double(N) * V + F * N + 4.0 * N);
}
void softmax_cross_entropy_backward(Ptr dlogits, CPtr, const std::int32_t*, float, int N, int V) {
  count(__func__, 0, 4.0 * N * V, bytes_of(dlogits) * 2.0 * N * V + 4.0 * N);
}
void row_max(float*, CPtr logits, int N, int V) {
  count(__func__, 0, double(N) * V, bytes_of(logits) * double(N) * V + F * N);
}
void row_exp_sum(float*, CPtr logits, const float*, int N, int V) {
  count(__func__, 0, 3.0 * N * V, bytes_of(logits) * double(N) * V + F * 2.0 * N);
}
void pick_target_logits(float*, CPtr logits, const std::int32_t*, int, int N, int) {
  count(__func__, 0, 0, (bytes_of(logits) + F) * N + 4.0 * N);
}
void cross_entropy_from_parts(float*, const float*, const float*, const float*, int N) {
  count(__func__, 0, 3.0 * N, F * 4.0 * N);
}
void softmax_cross_entropy_backward_sharded(Ptr dlogits, CPtr, const float*, const float*, const std::int32_t*, int,
                                            float, int N, int V) {
  count(__func__, 0, 4.0 * N * V, bytes_of(dlogits) * 2.0 * N * V + F * 2.0 * N + 4.0 * N);
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
