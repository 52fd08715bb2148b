// Whole training steps under Google Benchmark: the foundation's benchmark
// decks (inputs/bench-gpt.toml, inputs/bench-gemm.toml) with tokens/s and
// model FLOP/s counters, the sgemm rate a step is compared against, and the
// cost of profiling measured side by side (steps with and without the
// timeline alternate inside one benchmark, so machine noise hits both).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"
#include "src/deck/deck.hpp"
#include "kernels/foundation/clock.hpp"
#include "src/train/peak.hpp"
#include "src/train/trainer.hpp"

using namespace strata;

namespace {

plan::Plan load(const std::string& name, std::vector<std::string> sets = {}) {
  sets.push_back("run.steps=1000000");  // the trainer's step index only drives the lr schedule here
  return deck::load_deck(std::string(STRATA_SOURCE_DIR) + "/inputs/" + name, sets).config;
}

void train_steps(benchmark::State& state, const std::string& deck_name) {
  const auto cfg = load(deck_name);
  kernels::set_num_threads(cfg.backend.threads > 0 ? cfg.backend.threads : 1);
  core::MemoryTracker tracker;
  train::Trainer trainer(cfg, tracker, nullptr, 0.0);
  int s = 0;
  trainer.step(s++);  // warm-up
  for (auto _ : state) trainer.step(s++);
  const double tokens = double(cfg.data.global_batch) * cfg.model.seq_len;
  state.counters["tokens/s"] = benchmark::Counter(tokens, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["FLOP/s"] =
      benchmark::Counter(trainer.model_flops_per_step(), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_TrainStep_BenchGpt(benchmark::State& state) { train_steps(state, "bench-gpt.toml"); }
void BM_TrainStep_BenchGemm(benchmark::State& state) { train_steps(state, "bench-gemm.toml"); }

void BM_Sgemm1024(benchmark::State& state) {
  kernels::set_num_threads(1);
  const int n = 1024;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  for (auto _ : state) {
    kernels::matmul(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate);
}

// Median step time with the timeline on versus off, alternating.
void BM_ProfilingOverhead(benchmark::State& state) {
  const auto cfg = load("bench-gpt.toml");
  kernels::set_num_threads(1);
  core::MemoryTracker t_on, t_off;
  prof::Timeline timeline(true);
  train::Trainer on(cfg, t_on, &timeline, 0.0), off(cfg, t_off, nullptr, 0.0);
  std::vector<double> d_on, d_off;
  int s = 0;
  for (auto _ : state) {
    const bool on_first = s % 2 == 0;
    for (int k = 0; k < 2; ++k) {
      const bool use_on = (k == 0) == on_first;
      const double t0 = prof::now_seconds();
      (use_on ? on : off).step(s);
      (use_on ? d_on : d_off).push_back(prof::now_seconds() - t0);
    }
    ++s;
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  state.counters["overhead_%"] = 100.0 * (median(d_on) / median(d_off) - 1.0);
  state.counters["spans"] = double(timeline.spans().size());
}

}  // namespace

BENCHMARK(BM_Sgemm1024)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TrainStep_BenchGpt)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TrainStep_BenchGemm)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_ProfilingOverhead)->Unit(benchmark::kMillisecond)->Iterations(40);

BENCHMARK_MAIN();
