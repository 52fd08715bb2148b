// The dry run's estimate at scale: every rank of a 4096-rank layout (dp 64 x
// tp 8 x pp 8 of a 6.7 B-parameter GPT, inputs/gpt-7b-4096.toml) estimated
// in one process, steps run on the meta device. The target is under 10 s;
// it takes milliseconds, since a class of 512 identical ranks is run twice
// (its first and last rank) and kernels on the meta device do nothing.
#include <benchmark/benchmark.h>

#include "src/deck/deck.hpp"
#include "src/train/estimate.hpp"

static void BM_EstimateLayout(benchmark::State& state) {
  const auto cfg = strata::deck::load_deck(STRATA_SOURCE_DIR "/inputs/gpt-7b-4096.toml", {}).config;
  for (auto _ : state) {
    const auto e = strata::train::estimate(cfg);
    benchmark::DoNotOptimize(e.classes.data());
  }
  state.counters["ranks"] = double(cfg.parallel.dp * cfg.parallel.tp * cfg.parallel.pp);
}
BENCHMARK(BM_EstimateLayout)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
