// The GPU's kernel times at a GPT's shapes (bench/gpu-check.sh's table):
// every GEMM of a block and of the head, forward and both backward products,
// and the fused attention forward and backward, each the median of a few
// timed launches after a warm-up, with its FLOP/s. Tensors are in the
// format asked for (bf16: 16-bit tensors, tensor-core products with fp32
// accumulation), as the training run's are.
//
//   gpu_kernels B T C NH V [fp32|bf16]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"

namespace k = strata::kernels;

namespace {

// Median seconds of `reps` runs of f, each waited for.
double time_it(const std::function<void()>& f, int reps = 10) {
  f();
  k::synchronize();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    k::synchronize();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// n zeroed elements of format p on the device.
strata::core::Ptr device_tensor(std::size_t n, strata::core::Precision p) {
  const std::size_t bytes = n * std::size_t(strata::core::element_bytes(p));
  void* d = k::device_alloc(bytes);
  k::zero_bytes(d, bytes);
  return {d, p};
}

void row(const char* what, double seconds, double flops) {
  std::printf("%-34s %10.3f ms %10.1f TFLOP/s\n", what, seconds * 1e3, flops / seconds / 1e12);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s B T C NH V [fp32|bf16]\n", argv[0]);
    return 2;
  }
  const int B = std::atoi(argv[1]), T = std::atoi(argv[2]), C = std::atoi(argv[3]), NH = std::atoi(argv[4]),
            V = std::atoi(argv[5]);
  const std::string precision = argc > 6 ? argv[6] : "bf16";
  if (B < 1 || T < 1 || C < 1 || NH < 1 || V < 1 || C % NH != 0 || (precision != "fp32" && precision != "bf16")) {
    std::fprintf(stderr, "gpu_kernels: B, T, C, NH, V must be positive with C %% NH == 0, precision fp32 or bf16\n");
    return 2;
  }
  if (k::gpu_count() == 0) {
    std::fprintf(stderr, "gpu_kernels: no GPU\n");
    return 1;
  }
  k::use_device(k::Device::cuda);
  const strata::core::Precision format =
      precision == "bf16" ? strata::core::Precision::bf16 : strata::core::Precision::fp32;
  const std::int64_t N = std::int64_t(B) * T;
  const int F = 4 * C;
  std::printf("kernel times: B %d, T %d, C %d, heads %d, vocabulary %d, tensors %s\n", B, T, C, NH, V,
              precision.c_str());
  double gemm_total = 0;
  // y[N, out] = x[N, in] W^T; dx = dy W; dW = dy^T x: three products of 2 N in out FLOPs each.
  auto linear = [&](const char* name, int in, int out) {
    // The weight gradient accumulates in fp32, as the run's do.
    const strata::core::Ptr x = device_tensor(std::size_t(N) * in, format), w = device_tensor(std::size_t(out) * in, format),
                            y = device_tensor(std::size_t(N) * out, format),
                            dw = device_tensor(std::size_t(out) * in, strata::core::Precision::fp32);
    const double f = 2.0 * double(N) * in * out;
    const double fw = time_it([&] { k::matmul(false, true, int(N), out, in, 1.0f, x, in, w, in, 0.0f, y, out); });
    const double bi = time_it([&] { k::matmul(false, false, int(N), in, out, 1.0f, y, out, w, in, 0.0f, x, in); });
    const double bw = time_it([&] { k::matmul(true, false, out, in, int(N), 1.0f, y, out, x, in, 1.0f, dw, in); });
    row((std::string(name) + " forward").c_str(), fw, f);
    row((std::string(name) + " backward (input)").c_str(), bi, f);
    row((std::string(name) + " backward (weight)").c_str(), bw, f);
    gemm_total += fw + bi + bw;
    for (const strata::core::Ptr& t : {x, w, y, dw}) k::device_free(t.get());
  };
  linear("attn.qkv", C, 3 * C);
  linear("attn.proj", C, C);
  linear("mlp.fc", C, F);
  linear("mlp.proj", F, C);
  const double block_gemms = gemm_total;
  linear("head (tied wte)", C, V);
  // Attention: q k^T and p v over the causal half, forward; backward twice
  // that (dq, dk, dv, dp) plus the recomputed scores.
  const strata::core::Ptr qkv = device_tensor(std::size_t(N) * 3 * C, format), out = device_tensor(std::size_t(N) * C, format),
                          dqkv = device_tensor(std::size_t(N) * 3 * C, format);
  const strata::core::Ptr state = device_tensor(std::size_t(k::attention_state_elements(true, B, NH, T)),
                                                strata::core::Precision::fp32);
  const strata::core::Ptr scratch = device_tensor(std::size_t(k::attention_scratch_elements(true, B, NH, T, C, format)),
                                                  strata::core::Precision::fp32);
  const double causal = 2.0 * 2.0 * double(N) * T * C / 2;  // two products, half the square
  const double af = time_it([&] { k::attention_forward(out, state, qkv, B, T, C, NH, NH); });
  const double ab = time_it([&] { k::attention_backward(dqkv, scratch, out, qkv, out, state, B, T, C, NH, NH); });
  row("attention forward (fused)", af, causal);
  row("attention backward (fused)", ab, 2.5 * causal);
  std::printf("per block: GEMMs %.3f ms, attention %.3f ms (forward + backward)\n", block_gemms * 1e3,
              (af + ab) * 1e3);
  return 0;
}
