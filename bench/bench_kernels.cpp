// Google Benchmark microbenchmarks of the CPU kernels: compute-bound kernels
// report FLOP/s, memory-bound ones bytes/s (the bytes each call must move at
// least), both as raw rates in the JSON output so that calibration can read
// them directly. Threads: OMP_NUM_THREADS, as in a run. STRATA_BENCH_DEVICE=kokkos
// runs them on the Kokkos backend instead (a host-side Kokkos, whose memory
// the host vectors here are), to set its kernels beside the CPU's.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"

namespace k = strata::kernels;

namespace {

std::vector<float> random_vec(std::size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 g(1234);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

void set_flops(benchmark::State& state, double flops) {
  state.counters["FLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::OneK::kIs1000);
}

void set_bytes(benchmark::State& state, double bytes) {
  state.counters["bytes/s"] =
      benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::OneK::kIs1000);
}

// Args: M, N, K, trans_a, trans_b.
void BM_Matmul(benchmark::State& state) {
  const int M = int(state.range(0)), N = int(state.range(1)), K = int(state.range(2));
  const bool ta = state.range(3) != 0, tb = state.range(4) != 0;
  auto A = random_vec(std::size_t(M) * K), B = random_vec(std::size_t(K) * N);
  std::vector<float> C(std::size_t(M) * N);
  for (auto _ : state) {
    k::matmul(ta, tb, M, N, K, 1.0f, A.data(), ta ? M : K, B.data(), tb ? K : N, 0.0f, C.data(), N);
    benchmark::DoNotOptimize(C.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, 2.0 * M * N * K);
}
BENCHMARK(BM_Matmul)
    ->ArgNames({"M", "N", "K", "ta", "tb"})
    ->Args({1024, 1024, 1024, 0, 0})
    ->Args({1024, 768, 256, 0, 0})   // qkv projection, C = 256
    ->Args({1024, 256, 1024, 0, 0})  // MLP down projection
    ->Args({1024, 256, 768, 0, 1})   // its input gradient (dY W^T shape)
    ->Args({256, 768, 1024, 1, 0})   // a weight gradient (X^T dY)
    ->Args({128, 128, 64, 0, 1})     // one attention head's q k^T
    ->UseRealTime();

// 32 heads' q k^T, the attention-shaped batched product.
void BM_MatmulStridedBatched(benchmark::State& state) {
  const int T = 128, hs = 64, batch = 32;
  auto Q = random_vec(std::size_t(batch) * T * hs), K = random_vec(std::size_t(batch) * T * hs);
  std::vector<float> S(std::size_t(batch) * T * T);
  for (auto _ : state) {
    k::matmul_strided_batched(false, true, T, T, hs, 0.125f, Q.data(), hs, std::int64_t(T) * hs, K.data(), hs,
                              std::int64_t(T) * hs, 0.0f, S.data(), T, std::int64_t(T) * T, batch);
    benchmark::DoNotOptimize(S.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, 2.0 * batch * T * T * hs);
}
BENCHMARK(BM_MatmulStridedBatched)->UseRealTime();

void BM_LayerNormForward(benchmark::State& state) {
  const int N = int(state.range(0)), C = int(state.range(1));
  auto x = random_vec(std::size_t(N) * C), w = random_vec(C), b = random_vec(C);
  std::vector<float> out(x.size()), mean(N), rstd(N);
  for (auto _ : state) {
    k::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state, 2.0 * 4 * N * C);  // read inp, write out
}
BENCHMARK(BM_LayerNormForward)->ArgNames({"N", "C"})->Args({1024, 256})->Args({1024, 768})->UseRealTime();

void BM_LayerNormBackward(benchmark::State& state) {
  const int N = int(state.range(0)), C = int(state.range(1));
  auto x = random_vec(std::size_t(N) * C), w = random_vec(C), b = random_vec(C), dy = random_vec(x.size());
  std::vector<float> out(x.size()), mean(N), rstd(N), dx(x.size()), dw(C), db(C);
  k::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  for (auto _ : state) {
    k::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N,
                          C);
    benchmark::DoNotOptimize(dx.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state, 4.0 * 4 * N * C);  // read dout, inp, dinp; write dinp
}
BENCHMARK(BM_LayerNormBackward)->ArgNames({"N", "C"})->Args({1024, 256})->Args({1024, 768})->UseRealTime();

void BM_GeluForward(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  auto x = random_vec(n, -4.0f, 4.0f);
  std::vector<float> y(n);
  for (auto _ : state) {
    k::gelu_forward(y.data(), x.data(), n);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state, 2.0 * 4 * n);
}
BENCHMARK(BM_GeluForward)->ArgNames({"n"})->Arg(1024 * 1024)->UseRealTime();

void BM_GeluBackward(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  auto x = random_vec(n, -4.0f, 4.0f), dy = random_vec(n);
  std::vector<float> dx(n);
  for (auto _ : state) {
    k::gelu_backward(dx.data(), x.data(), dy.data(), n);
    benchmark::DoNotOptimize(dx.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state, 4.0 * 4 * n);
}
BENCHMARK(BM_GeluBackward)->ArgNames({"n"})->Arg(1024 * 1024)->UseRealTime();

// FLOPs of attention are counted as the dense products would be (4 B T^2 C
// forward, 8 B T^2 C backward), though the causal kernel skips part of them.
void BM_AttentionForward(benchmark::State& state) {
  const int B = 8, T = 128, C = 256, NH = 4;
  auto qkv = random_vec(std::size_t(B) * T * 3 * C);
  std::vector<float> out(std::size_t(B) * T * C), probs(std::size_t(B) * NH * T * T);
  for (auto _ : state) {
    k::attention_forward(out.data(), probs.data(), qkv.data(), B, T, C, NH, NH);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, 4.0 * B * T * T * C);
}
BENCHMARK(BM_AttentionForward)->UseRealTime();

void BM_AttentionBackward(benchmark::State& state) {
  const int B = 8, T = 128, C = 256, NH = 4;
  auto qkv = random_vec(std::size_t(B) * T * 3 * C), dout = random_vec(std::size_t(B) * T * C);
  std::vector<float> out(dout.size()), probs(std::size_t(B) * NH * T * T), scratch(probs.size()), dqkv(qkv.size());
  k::attention_forward(out.data(), probs.data(), qkv.data(), B, T, C, NH, NH);
  for (auto _ : state) {
    k::attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), out.data(), probs.data(), B, T, C, NH, NH);
    benchmark::DoNotOptimize(dqkv.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, 8.0 * B * T * T * C);
}
BENCHMARK(BM_AttentionBackward)->UseRealTime();

// Forward then backward, as a training step calls them.
void BM_CrossEntropy(benchmark::State& state) {
  const int N = int(state.range(0)), V = int(state.range(1));
  auto logits = random_vec(std::size_t(N) * V, -4.0f, 4.0f);
  std::vector<float> dlogits(logits.size()), losses(N);
  std::vector<std::int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = (n * 7919) % V;
  for (auto _ : state) {
    k::softmax_cross_entropy_forward(losses.data(), logits.data(), targets.data(), N, V);
    k::softmax_cross_entropy_backward(dlogits.data(), logits.data(), targets.data(), 1.0f / N, N, V);
    benchmark::DoNotOptimize(dlogits.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state, 3.0 * 4 * N * V);  // read logits twice, write dlogits
}
BENCHMARK(BM_CrossEntropy)->ArgNames({"N", "V"})->Args({1024, 256})->Args({64, 50304})->UseRealTime();

void BM_AdamW(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  auto p = random_vec(n), g = random_vec(n);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  int step = 0;
  for (auto _ : state) {
    k::adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, ++step);
    benchmark::DoNotOptimize(p.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state, 28.0 * n);  // read param, grad, m, v; write param, m, v
}
BENCHMARK(BM_AdamW)->ArgNames({"n"})->Arg(10'000'000)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (const char* d = std::getenv("STRATA_BENCH_DEVICE"); d != nullptr && std::string(d) == "kokkos") {
    k::use_device(k::Device::kokkos);
    if (!k::host_memory()) {
      std::fprintf(stderr, "STRATA_BENCH_DEVICE=kokkos needs a host-side Kokkos (this one's memory is %s's)\n",
                   k::backend_name());
      return 2;
    }
  }
  benchmark::AddCustomContext("kernels", k::backend_name());
  benchmark::AddCustomContext("kernel_threads", std::to_string(k::num_threads()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
