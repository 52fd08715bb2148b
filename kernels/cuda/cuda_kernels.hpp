// The CUDA backend of the kernel interface (kernels/kernels.hpp), growing
// kernel by kernel: the same operations with the same contracts (shapes,
// accumulation into gradients, fp32 arithmetic in the same order where it
// matters), on device pointers. The CPU backend is the reference every one
// of them is tested against on the same random inputs
// (tests/unit/test_cuda_kernels.cpp, run on a GPU; skipped without one).
//
// Built when nvcc is found (STRATA_WITH_CUDA=AUTO) or asked for (ON); the
// rest of the program does not use it yet: the device arena, the NCCL
// communicator and the backend switch (backend.device = "cuda") come next.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace strata::kernels::cuda {

// ---- runtime ----
// CUDA devices usable from this process: 0 without a driver or a GPU (never
// throws, so a test can skip with the reason).
int device_count();
// Why device_count() is 0 ("no CUDA driver", the runtime's message), or the
// first device's name and compute capability.
std::string describe_devices();
void synchronize();

// Device memory, for tests and benchmarks (the tracked device arena will
// sub-allocate one cudaMalloc).
void* malloc_device(std::size_t bytes);
void free_device(void* p);
void copy_to_device(void* dst, const void* src, std::size_t bytes);
void copy_to_host(void* dst, const void* src, std::size_t bytes);

// ---- matmul (cuBLAS sgemm; as kernels.hpp, row-major) ----
void matmul(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
            int ldb, float beta, float* C, int ldc);
void matmul_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                            std::int64_t stride_a, const float* B, int ldb, std::int64_t stride_b, float beta,
                            float* C, int ldc, std::int64_t stride_c, int batch);

// ---- elementwise (as kernels.hpp) ----
void residual_forward(float* out, const float* a, const float* b, std::int64_t n);
void add_inplace(float* y, const float* x, std::int64_t n);
void scale_inplace(float* x, float s, std::int64_t n);
void fill_zero(float* x, std::int64_t n);
void bias_add(float* out, const float* bias, int N, int C);
void gelu_forward(float* out, const float* inp, std::int64_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n);
void bias_backward(float* dbias, const float* dout, int N, int C);
double sum_squares(const float* x, std::int64_t n);  // synchronises: the result comes to the host

// ---- LayerNorm (as kernels.hpp): one block per row ----
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps = 1e-5f);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C);

// ---- token + position embedding (as kernels.hpp; the backward adds rows
// with atomics, so its sums' order varies) ----
void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                       int v_begin = 0, int v_count = -1);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int B, int T, int C,
                        int v_begin = 0, int v_count = -1);

// ---- fused softmax cross-entropy (as kernels.hpp): one block per row ----
void softmax_cross_entropy_forward(float* losses, const float* logits, const std::int32_t* targets, int N, int V);
void softmax_cross_entropy_backward(float* dlogits, const float* logits, const std::int32_t* targets, float dloss,
                                    int N, int V);

// ---- AdamW (as kernels.hpp, the same per-element arithmetic) ----
void adamw_update(float* param, const float* grad, float* m, float* v, std::int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int step);

}  // namespace strata::kernels::cuda
