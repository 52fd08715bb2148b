// The kernel interface: every numerical operation a model or a strategy needs,
// declared once here and implemented per backend (kernels/cpu today; a CUDA
// backend implements the same header). Kernels never allocate: every buffer,
// scratch included, is passed in, so that memory stays in plain sight and is
// accounted for by the caller.
//
// Conventions
//   * Row-major, fp32, contiguous unless a leading dimension says otherwise.
//   * Shapes: B batch, T sequence, C channels (d_model), NH heads, V vocab,
//     N = B*T rows.
//   * Backward kernels ACCUMULATE (+=) into every gradient output; callers zero
//     gradient buffers when a new accumulation starts. The one exception is
//     softmax_cross_entropy_backward, which writes its output so that it may
//     overwrite the logits in place.
#pragma once

#include <cstdint>

#include "src/core/precision.hpp"

namespace strata::kernels {

// ---- runtime ----
// Threads used by OpenMP loops and by BLAS.
void set_num_threads(int n);
int num_threads();
// Name of the backend and its BLAS, for the report ("cpu/openblas-openmp").
const char* backend_name();

// ---- matmul (BLAS sgemm) ----
// C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C, row-major.
// op(A) = A^T when trans_a (then A is stored K x M with leading dimension lda).
void matmul(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc);
// `batch` independent matmuls, the i-th on A + i*stride_a, B + i*stride_b,
// C + i*stride_c.
void matmul_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                            int lda, std::int64_t stride_a, const float* B, int ldb, std::int64_t stride_b,
                            float beta, float* C, int ldc, std::int64_t stride_c, int batch);

// ---- bias ----
// out[n, c] += bias[c]
void bias_add(float* out, const float* bias, int N, int C);
// dbias[c] += sum_n dout[n, c]
void bias_backward(float* dbias, const float* dout, int N, int C);

// ---- LayerNorm over the last dimension ----
// out = (inp - mean) * rstd * weight + bias; mean[N] and rstd[N] are saved
// for the backward pass. rstd = 1 / sqrt(var + eps), var the biased variance.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps = 1e-5f);
// dinp += ..., dweight += ..., dbias += ...
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C);

// ---- GELU, tanh approximation ----
// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
void gelu_forward(float* out, const float* inp, std::int64_t n);
// dinp += gelu'(inp) * dout
void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n);

// ---- elementwise ----
// out = a + b (out may alias a or b)
void residual_forward(float* out, const float* a, const float* b, std::int64_t n);
// y += x
void add_inplace(float* y, const float* x, std::int64_t n);
// x *= s
void scale_inplace(float* x, float s, std::int64_t n);
void fill_zero(float* x, std::int64_t n);
// sum of squares, accumulated in double: the global gradient norm is
// sqrt of the sum of this over every gradient buffer (and, later, every rank).
double sum_squares(const float* x, std::int64_t n);

// ---- causal multi-head self-attention ----
// qkv [B, T, 3C]: q = qkv[..., 0:C], k = qkv[..., C:2C], v = qkv[..., 2C:3C];
// head h owns channels [h*hs, (h+1)*hs) of each, hs = C / NH.
// probs [B, NH, T, T]: softmax(q k^T / sqrt(hs)) with the causal mask (row t
// attends to 0..t; entries above the diagonal are 0), saved for backward.
// out [B, T, C]: probs @ v, heads concatenated.
void attention_forward(float* out, float* probs, const float* qkv, int B, int T, int C, int NH);
// dqkv [B, T, 3C] += gradient; dprobs_scratch [B, NH, T, T] is overwritten.
void attention_backward(float* dqkv, float* dprobs_scratch, const float* dout, const float* qkv,
                        const float* probs, int B, int T, int C, int NH);

// ---- token + position embedding ----
// out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :]
// Vocabulary-parallel: wte holds rows [v_begin, v_begin + v_count) of the
// table, and a token outside them contributes 0; wpe may be null (added
// later, once, after the partial rows are summed over the ranks).
// v_count < 0: the whole table.
void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                       int C, int v_begin = 0, int v_count = -1);
// dwte[tokens[b,t] - v_begin, :] += dout[b, t, :] for local tokens;
// dwpe[t, :] += dout[b, t, :] unless dwpe is null.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int B, int T,
                        int C, int v_begin = 0, int v_count = -1);

// ---- fused softmax cross-entropy ----
// losses[n] = logsumexp(logits[n, :]) - logits[n, targets[n]]
void softmax_cross_entropy_forward(float* losses, const float* logits, const std::int32_t* targets, int N, int V);
// dlogits[n, :] = (softmax(logits[n, :]) - onehot(targets[n])) * dloss
// (dloss is the same scalar for every row, e.g. 1/N for a mean loss).
// WRITES dlogits, which may be the same pointer as logits.
void softmax_cross_entropy_backward(float* dlogits, const float* logits, const std::int32_t* targets, float dloss,
                                    int N, int V);

// ---- vocabulary-parallel cross-entropy, in pieces ----
// A rank holds the logit columns [v_begin, v_begin + V) of N rows; the
// caller combines the pieces across ranks (max and sums all-reduced), so no
// rank ever holds full-vocabulary logits. With one rank (v_begin 0) they
// compose to the fused kernels above.
// m[n] = max_i logits[n, i]
void row_max(float* m, const float* logits, int N, int V);
// s[n] = sum_i exp(logits[n, i] - m[n])
void row_exp_sum(float* s, const float* logits, const float* m, int N, int V);
// x[n] = logits[n, targets[n] - v_begin] when the target is local, else 0.
void pick_target_logits(float* x, const float* logits, const std::int32_t* targets, int v_begin, int N, int V);
// losses[n] = m[n] + log(s[n]) - x[n]   (m, s and x combined over the ranks)
void cross_entropy_from_parts(float* losses, const float* m, const float* s, const float* x, int N);
// dlogits[n, i] = (exp(logits[n, i] - m[n]) / s[n] - [targets[n] == v_begin + i]) * dloss
// WRITES dlogits, which may be the same pointer as logits.
void softmax_cross_entropy_backward_sharded(float* dlogits, const float* logits, const float* m, const float* s,
                                            const std::int32_t* targets, int v_begin, float dloss, int N, int V);

// ---- mixed precision: 16-bit storage (bf16 or fp16, see src/core/precision.hpp) ----
// Every conversion rounds to nearest, ties to even; sums are taken in fp32
// (or double) and rounded once.
// y[i] = float(x[i])
void widen(float* y, const std::uint16_t* x, std::int64_t n, core::Precision p);
// y[i] = round(x[i])
void narrow(std::uint16_t* y, const float* x, std::int64_t n, core::Precision p);
// y[i] = round(float(y[i]) + x[i]): a 16-bit accumulator taking an fp32 addend.
void narrow_add(std::uint16_t* y, const float* x, std::int64_t n, core::Precision p);
// y[i] = round(float(y[i]) + float(x[i]))
void add_half(std::uint16_t* y, const std::uint16_t* x, std::int64_t n, core::Precision p);
// Sum of squares of the widened elements, in double (as sum_squares).
double sum_squares_half(const std::uint16_t* x, std::int64_t n, core::Precision p);
// AdamW on fp32 master weights from 16-bit gradients (ZeRO's mixed-precision
// step): g = float(grad[i]) * grad_scale (unscaling and clipping folded into
// one factor), master updated exactly as adamw_update does, and the 16-bit
// parameter the model reads rewritten as round(master).
void adamw_update_mixed(float* master, std::uint16_t* param, const std::uint16_t* grad, float grad_scale, float* m,
                        float* v, std::int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                        int step, core::Precision p);

// ---- AdamW (Loshchilov & Hutter), as torch.optim.AdamW computes it ----
// step t >= 1:
//   param *= 1 - lr * weight_decay
//   m = beta1 m + (1 - beta1) g ;  v = beta2 v + (1 - beta2) g^2
//   param -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
void adamw_update(float* param, const float* grad, float* m, float* v, std::int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int step);

}  // namespace strata::kernels
