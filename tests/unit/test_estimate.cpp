// The dry run's estimate (src/train/estimate.hpp): one step run on the meta
// device, for any rank of any layout, in this process. On one rank it equals
// what a run of the same deck measures, per pool and category, held and
// peak, under every strategy a single rank can run (the MPI parity tests
// assert the same on every layout of 2, 4 and 8 ranks). A 4096-rank layout
// of a 7B-class GPT falls into one class per pipeline stage, holding ZeRO-1's
// mixed-precision bytes of its stage exactly.
#include <gtest/gtest.h>

#include <cstdint>

#include <filesystem>
#include <map>

#include <fmt/format.h>
#include <unistd.h>

#include "models/decoder/decoder.hpp"
#include "models/gpt/family.hpp"
#include "kernels/kernels.hpp"
#include "src/deck/deck.hpp"
#include "src/train/estimate.hpp"
#include "src/train/trainer.hpp"

using namespace strata;
using core::MemCategory;
using core::Pool;

namespace {

plan::Plan tiny(const std::vector<std::string>& sets) {
  const std::string text =
      "[run]\nsteps = 3\nwarmup_steps = 0\nseed = 11\n"
      "[model]\nlayers = 2\nd_model = 16\nheads = 2\nvocab = 32\nseq_len = 8\n"
      "[data]\nglobal_batch = 4\nmicro_batch = 2\n"
      "[optim]\nlr = 3e-3\n"
      "[backend]\nthreads = 1\n";
  return deck::parse_deck("tiny.toml", text, sets).config;
}

}  // namespace

TEST(Estimate, OneRankMeasuresWhatItEstimates) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / fmt::format("strata-estimate-{}", ::getpid())).string();
  const std::vector<std::vector<std::string>> variants = {
      {},
      {"parallel.zero=3"},
      {"model.recompute=\"selective\""},
      {"model.recompute=\"full\""},
      {"backend.precision=\"bf16\""},
      {"backend.precision=\"fp16\"", "parallel.zero=2"},
      {"parallel.offload=\"host\""},
      {"parallel.offload=\"nvme\"", "offload.path=\"" + dir + "\"", "offload.chunk_mb=0.00390625"},
      {"parallel.offload=\"nvme\"", "offload.path=\"" + dir + "\"", "parallel.zero=3", "offload.params=true",
       "backend.precision=\"bf16\""},
      {"model.kind=\"moe\"", "model.moe_experts=4"},
      {"model.kind=\"moe\"", "model.moe_experts=4", "model.moe_every=2", "parallel.zero=2", "backend.precision=\"bf16\""},
  };
  for (const auto& sets : variants) {
    std::string what;
    for (const auto& s : sets) what += s + " ";
    SCOPED_TRACE(what);
    const plan::Plan c = tiny(sets);
    core::MemoryTracker tracker;
    train::Trainer t(c, tracker, nullptr, 0.0);
    for (int s = 0; s < c.run.steps; ++s) {
      tracker.reset_peaks();
      t.step(s);
    }
    const train::RankMemory got = train::rank_memory(tracker, t.host_tracker(), t.nvme_file());
    const train::RankMemory want = train::estimate_rank(c, 0);
    EXPECT_TRUE(got == want) << "measured:  " << train::describe(got) << "\nestimated: " << train::describe(want);
    EXPECT_GT(got[Pool::device].total_peak, 0u);
    if (c.parallel.offload != plan::Offload::none) {
      EXPECT_GT(got[Pool::host].held[int(MemCategory::optimizer)], 0u);
    }
    if (c.parallel.offload == plan::Offload::nvme) {
      EXPECT_GT(got[Pool::nvme].total_peak, 0u);
    }
    EXPECT_EQ(kernels::device(), kernels::Device::cpu) << "the estimate gives the device back";
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// The dry run writes nothing: no NVMe file on the meta device.
TEST(Estimate, NvmeOffloadCreatesNoFile) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / fmt::format("strata-estimate-none-{}", ::getpid())).string();
  const plan::Plan c = tiny({"parallel.offload=\"nvme\"", "offload.path=\"" + dir + "\""});
  const train::RankMemory m = train::estimate_rank(c, 0);
  EXPECT_GT(m[Pool::nvme].held[int(MemCategory::optimizer)], 0u);
  EXPECT_FALSE(std::filesystem::exists(dir));
}

// dp 64 x tp 8 x pp 8 of a 6.7 B-parameter GPT: one class per pipeline
// stage, 512 ranks each; every rank of a stage holds its tensor-parallel
// slice of the stage's parameters whole (ZeRO-1: 2 bytes each in bf16,
// padded per unit to a multiple of dp) and 12 bytes per element of its
// 1/64 shard in the optimizer.
TEST(Estimate, A4096RankLayoutIsOneClassPerStage) {
  const plan::Plan c = deck::load_deck(STRATA_SOURCE_DIR "/inputs/gpt-7b-4096.toml", {}).config;
  const train::Estimate e = train::estimate(c);
  EXPECT_EQ(e.world, 4096);
  ASSERT_EQ(e.classes.size(), 8u);
  const models::DecoderConfig gc = models::gpt_config(c);
  for (int s = 0; s < 8; ++s) {
    const auto& k = e.classes[std::size_t(s)];
    ASSERT_EQ(k.ranks.size(), 512u);
    EXPECT_EQ(k.ranks.front(), 512 * s);
    EXPECT_EQ(k.ranks.back(), 512 * s + 511);
    const models::Stage stage = models::stage_of(gc.layers, s, 8);
    const models::ParamRegistry reg = models::decoder_registry(gc, 8, 0, stage);
    std::uint64_t shard = 0;
    for (const auto& u : models::decoder_units(reg, gc, stage)) shard += std::uint64_t((u.size() + 63) / 64);
    const train::PoolFigures& d = k.memory[Pool::device];
    EXPECT_EQ(d.held[int(MemCategory::params)], 2 * 64 * shard) << "stage " << s;
    EXPECT_EQ(d.held[int(MemCategory::grads)], 2 * 64 * shard) << "stage " << s;
    EXPECT_EQ(d.held[int(MemCategory::optimizer)], 12 * shard) << "stage " << s;
    EXPECT_GE(d.total_peak, d.total_held());
  }
  EXPECT_TRUE(e.does_not_fit.empty());
  // A byte below the smallest stage's peak fits no stage; at the largest
  // stage's peak, every stage fits.
  std::size_t least = SIZE_MAX, most = 0;
  for (const auto& k : e.classes) {
    least = std::min(least, k.memory[Pool::device].total_peak);
    most = std::max(most, k.memory[Pool::device].total_peak);
  }
  plan::Plan small = c;
  small.backend.memory_limit = least - 1;
  EXPECT_EQ(train::estimate(small).does_not_fit.size(), 8u) << "a byte below the smallest peak fits no stage";
  small.backend.memory_limit = most;
  EXPECT_TRUE(train::estimate(small).does_not_fit.empty()) << "the largest peak fits every stage";
}

namespace {

// One step's matrix-product FLOPs per phase, over every layer.
std::map<std::string, double> matmul_flops(const std::vector<kernels::WorkCost>& work) {
  std::map<std::string, double> out;
  for (const auto& w : work) out[w.phase] += w.matmul_flops;
  return out;
}

}  // namespace

// The compute a dry run declares is its kernels' work, counted on the meta
// device per layer and phase: the matrix products of a step's forward are
// the model's FLOPs (Megatron's count, decoder_forward_flops) exactly, the
// backward's twice that (input and weight gradients), recomputation's the
// hardware FLOPs' excess; a split backward's halves are one forward each;
// and tensor parallelism splits every product evenly over its ranks.
TEST(Estimate, ComputeIsTheModelsFlops) {
  for (const std::string recompute : {"none", "selective", "full", "op"}) {
    SCOPED_TRACE(recompute);
    const plan::Plan c = tiny({"model.recompute=\"" + recompute + "\"", "model.layers=3"});
    std::vector<kernels::WorkCost> work;
    train::estimate_rank(c, 0, nullptr, &work);
    const models::DecoderConfig gc = models::gpt_config(c);
    const double forward = models::decoder_model_flops(gc, c.data.global_batch) / 3;
    auto f = matmul_flops(work);
    EXPECT_DOUBLE_EQ(f["forward"], forward);
    EXPECT_DOUBLE_EQ(f["backward"], 2 * forward);
    EXPECT_DOUBLE_EQ(f["recompute"],
                     models::decoder_hardware_flops(gc, c.data.global_batch) - models::decoder_model_flops(gc, c.data.global_batch));
    EXPECT_EQ(f.count("backward_input"), 0u);
    for (const auto& w : work) {
      EXPECT_GT(w.kernels, 0) << w.layer << " " << w.phase;
      EXPECT_GT(w.bytes, 0) << w.layer << " " << w.phase;
    }
  }
  // Two pipeline stages under ZB-H1: the halves of each stage's backward.
  const plan::Plan zb = tiny({"parallel.pp=2", "parallel.schedule=\"zb-h1\"", "data.micro_batch=1"});
  const models::DecoderConfig gz = models::gpt_config(zb);
  double forward = 0, input = 0, weight = 0;
  for (int r = 0; r < 2; ++r) {
    std::vector<kernels::WorkCost> work;
    train::estimate_rank(zb, r, nullptr, &work);
    auto f = matmul_flops(work);
    forward += f["forward"], input += f["backward_input"], weight += f["backward_weight"];
    EXPECT_EQ(f.count("backward"), 0u);
  }
  EXPECT_DOUBLE_EQ(forward, models::decoder_model_flops(gz, zb.data.global_batch) / 3);
  EXPECT_DOUBLE_EQ(input + weight, 2 * forward);
  // tp 2: each rank half of every product.
  const plan::Plan tp = tiny({"parallel.tp=2", "parallel.sequence_parallel=true"});
  const double whole = models::decoder_model_flops(models::gpt_config(tp), tp.data.global_batch) / 3;
  for (int r = 0; r < 2; ++r) {
    std::vector<kernels::WorkCost> work;
    train::estimate_rank(tp, r, nullptr, &work);
    EXPECT_DOUBLE_EQ(matmul_flops(work)["forward"], whole / 2) << "tp rank " << r;
  }
}
