// What `strata plan` pays per layout of inputs/gpt-7b-4096.toml at 512
// devices: its lower bound with nothing cached (one prediction of a
// two-block model on one stage; layouts differing only in their pipeline
// share it) against its judgement (plan_figures: two predictions of the
// whole layout). Their ratio is what pruning a layout saves.
#include <benchmark/benchmark.h>

#include "src/deck/deck.hpp"
#include "src/sim/machine.hpp"
#include "src/train/bound.hpp"
#include "src/train/search.hpp"

namespace {

strata::plan::Plan layout(const benchmark::State& state) {
  const auto n = [&](int i) { return std::to_string(state.range(i)); };
  return strata::deck::load_deck(STRATA_SOURCE_DIR "/inputs/gpt-7b-4096.toml",
                                 {"parallel.tp=" + n(0), "parallel.pp=" + n(1), "parallel.dp=" + n(2)})
      .config;
}

void layouts(benchmark::internal::Benchmark* b) {
  b->ArgNames({"tp", "pp", "dp"});
  b->Args({1, 1, 512})->Args({2, 4, 64})->Args({8, 8, 8})->Args({8, 32, 2});
}

void BM_Bound(benchmark::State& state) {
  const auto cfg = layout(state);
  const auto machine = strata::sim::load_machine("h100-80gb");
  for (auto _ : state) {
    strata::train::StepBound bound(machine);
    benchmark::DoNotOptimize(bound(cfg));
  }
}
void BM_Judge(benchmark::State& state) {
  const auto cfg = layout(state);
  const auto machine = strata::sim::load_machine("h100-80gb");
  for (auto _ : state) benchmark::DoNotOptimize(strata::train::plan_figures(cfg, machine).step_time);
}

}  // namespace

BENCHMARK(BM_Bound)->Apply(layouts)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Judge)->Apply(layouts)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
