// The trainer: data keyed by global sample index, the learning-rate
// schedules, gradient accumulation reproducing the single-micro-batch
// trajectory, and learning on text.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "src/deck/deck.hpp"
#include "src/train/data.hpp"
#include "src/train/lr_schedule.hpp"
#include "src/train/run_report.hpp"
#include "strategies/pp/schedule.hpp"
#include "strategies/registry.hpp"
#include "models/decoder/decoder.hpp"
#include "models/gpt/family.hpp"
#include "src/train/trainer.hpp"

using namespace strata;

namespace {

plan::Plan tiny_config(const std::vector<std::string>& sets) {
  const std::string text =
      "[run]\nsteps = 6\nwarmup_steps = 1\nseed = 11\n"
      "[model]\nlayers = 2\nd_model = 16\nheads = 2\nvocab = 29\nseq_len = 8\n"
      "[data]\nglobal_batch = 4\nmicro_batch = 4\n"
      "[optim]\nlr = 3e-3\nweight_decay = 0.1\ngrad_clip = 1.0\n"
      "[backend]\nthreads = 1\n";
  return deck::parse_deck("tiny.toml", text, sets).config;
}

std::vector<double> losses(const plan::Plan& c) {
  core::MemoryTracker tracker;
  train::Trainer t(c, tracker, nullptr, 0.0);
  std::vector<double> out;
  for (int s = 0; s < c.run.steps; ++s) out.push_back(t.step(s).loss);
  return out;
}

}  // namespace

TEST(Data, SamplesAreKeyedByGlobalIndex) {
  const auto c = tiny_config({});
  auto data = train::make_data_source(c);
  const int T = c.model.seq_len;
  std::vector<std::int32_t> all_tok(8 * T), all_tgt(8 * T), tok(2 * T), tgt(2 * T);
  train::fill_batch(*data, 0, 8, T, all_tok.data(), all_tgt.data());
  train::fill_batch(*data, 3, 2, T, tok.data(), tgt.data());
  for (int i = 0; i < 2 * T; ++i) {
    EXPECT_EQ(tok[i], all_tok[3 * T + i]);
    EXPECT_EQ(tgt[i], all_tgt[3 * T + i]);
  }
  // Targets are the inputs shifted by one; ids are inside the vocabulary.
  for (int t = 0; t + 1 < T; ++t) EXPECT_EQ(all_tgt[t], all_tok[t + 1]);
  for (auto x : all_tok) EXPECT_TRUE(x >= 0 && x < c.model.vocab);
  // Samples differ from each other.
  EXPECT_NE(std::vector<int>(all_tok.begin(), all_tok.begin() + T),
            std::vector<int>(all_tok.begin() + T, all_tok.begin() + 2 * T));
}

TEST(LrSchedule, ConstantAndCosineWithWarmup) {
  plan::OptimSection o;
  o.lr = 1.0;
  o.warmup = 4;
  o.schedule = plan::LrSchedule::constant;
  EXPECT_DOUBLE_EQ(train::learning_rate(o, 0, 20), 0.25);
  EXPECT_DOUBLE_EQ(train::learning_rate(o, 3, 20), 1.0);
  EXPECT_DOUBLE_EQ(train::learning_rate(o, 19, 20), 1.0);
  o.schedule = plan::LrSchedule::cosine;
  o.min_lr = 0.1;
  EXPECT_DOUBLE_EQ(train::learning_rate(o, 4, 20), 1.0);
  EXPECT_NEAR(train::learning_rate(o, 12, 20), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.5)), 1e-12);
  EXPECT_GT(train::learning_rate(o, 19, 20), 0.1);
  EXPECT_LT(train::learning_rate(o, 19, 20), 0.12);
}

// Gradient accumulation is the trivial schedule: 1, 2 or 4 micro-batches of
// one global batch give the same trajectory (fp32: within 1e-5 relative).
TEST(Trainer, GradientAccumulationMatchesOneMicroBatch) {
  const auto ref = losses(tiny_config({}));
  for (const char* mb : {"data.micro_batch=2", "data.micro_batch=1"}) {
    const auto got = losses(tiny_config({mb}));
    for (std::size_t s = 0; s < ref.size(); ++s)
      EXPECT_NEAR(got[s], ref[s], 1e-5 * std::fabs(ref[s])) << mb << " step " << s;
  }
}

TEST(Trainer, RecordsAreConsistent) {
  auto c = tiny_config({});
  core::MemoryTracker tracker;
  prof::Timeline tl(true);
  train::Trainer t(c, tracker, &tl, 1e9);
  const auto r0 = t.step(0), r1 = t.step(1);
  EXPECT_TRUE(r0.warmup);
  EXPECT_FALSE(r1.warmup);
  EXPECT_DOUBLE_EQ(r1.tokens, double(c.data.global_batch * c.model.seq_len));
  EXPECT_NEAR(r1.tokens_per_s * r1.step_time, r1.tokens, 1e-9 * r1.tokens);
  EXPECT_NEAR(r1.mfu, r1.flops_per_s / 1e9, 1e-12);
  // 2 micro-batch-free steps x (forward + backward) x (L + 2) spans + 1 optimizer span each.
  EXPECT_EQ(tl.spans().size(), std::size_t(2 * (2 * (c.model.layers + 2) + 1)));
  for (const auto& s : tl.spans()) EXPECT_LE(s.start, s.end);
}

// A report names the state strategy by its row's label (a run, an estimate
// and a simulation alike): the name the strategy gives itself.
TEST(Trainer, TheStateRowsLabelIsTheStrategysName) {
  for (const char* zero : {"0", "1", "2", "3"}) {
    const auto c = tiny_config({std::string("parallel.zero=") + zero});
    core::MemoryTracker tracker;
    train::Trainer t(c, tracker, nullptr, 0.0);
    EXPECT_EQ(strategies::chosen_state(c).label(c), t.strategy().name()) << "zero " << zero;
  }
}

// On real text the model learns: the loss falls well below its start.
TEST(Trainer, LossFallsOnText) {
  const std::string corpus = "/usr/share/common-licenses/GPL-3";
  ASSERT_TRUE(std::filesystem::exists(corpus)) << "base-files ships " << corpus;
  auto c = tiny_config({"data.source=text", "data.path=" + corpus, "model.vocab=256", "run.steps=40",
                        "optim.lr=1e-2", "model.seq_len=16", "data.global_batch=8", "data.micro_batch=8"});
  const auto l = losses(c);
  EXPECT_LT(l.back(), 0.75 * l.front()) << "first " << l.front() << " last " << l.back();
}

// A MoE model's routing records: every token's k assignments are counted
// once per MoE block and step, dropped ones within them, and the step's
// drop rate, imbalance and auxiliary loss follow from the records.
TEST(Trainer, MoeRoutingRecordsAddUp) {
  auto c = tiny_config({"model.kind=\"moe\"", "model.moe_experts=4", "model.moe_top_k=2", "model.moe_every=1",
                        "model.moe_capacity_factor=0.75", "model.moe_aux_coef=0.1"});
  core::MemoryTracker tracker;
  train::Trainer t(c, tracker, nullptr, 1e9);
  const auto r = t.step(0);
  const std::int64_t tokens = std::int64_t(c.data.global_batch) * c.model.seq_len;
  std::int64_t routed = 0, dropped = 0;
  for (int l = 0; l < c.model.layers; ++l) {
    std::int64_t layer_routed = 0, most = 0;
    double mass = 0;
    for (const auto& e : t.expert_records()) {
      if (e.layer != l) continue;
      EXPECT_LE(e.dropped, e.routed);
      layer_routed += e.routed;
      most = std::max(most, e.routed);
      mass += e.prob_mass;
      dropped += e.dropped;
    }
    EXPECT_EQ(layer_routed, 2 * tokens) << "layer " << l;
    EXPECT_NEAR(mass, double(tokens), 1e-3 * tokens) << "probabilities sum to 1 per token";
    EXPECT_LE(double(most) * 4 / double(layer_routed), r.load_imbalance + 1e-12);
    routed += layer_routed;
  }
  EXPECT_EQ(t.expert_records().size(), std::size_t(c.model.layers * 4));
  EXPECT_GT(dropped, 0) << "capacity 0.75 must drop";
  EXPECT_DOUBLE_EQ(r.drop_rate, double(dropped) / double(routed));
  // coef x E x sum_e f_e P_e, with sum_e f_e = 1 and P_e <= 1: in (0, coef x E] per block.
  EXPECT_GT(r.moe_aux, 0.0);
  EXPECT_LE(r.moe_aux, 0.1 * 4 * c.model.layers);
}

// Activation recomputation changes where activations come from, not the
// arithmetic: selective and full reproduce the plain run bit for bit (every
// loss and the final parameters), dense and MoE. Per-op rebuilds k with a
// product of its own rows of the qkv weight (as torchtitan's separate wk
// does), which the BLAS may sum in another order than the fused qkv
// product: k's last bit may differ, so per-op is held to 1e-6 of the losses
// and parity's fp32 bound on the parameters (measured: 1 ulp). The
// activation bytes fall by what the recomputed buffers of all but one block
// hold (less what the per-op policy keeps besides), and the hardware FLOPs
// exceed the model FLOPs by the recomputed forward work.
TEST(Trainer, RecomputationIsExactAndSavesTheActivationsItRebuilds) {
  const int L = 3, B = 2, T = 8, C = 16, NH = 2, F = 4 * C, N = B * T;
  for (const char* kind : {"gpt", "moe"}) {
    SCOPED_TRACE(kind);
    const std::vector<std::string> base = {
        "model.layers=3", "data.global_batch=4", "data.micro_batch=2", std::string("model.kind=") + kind,
        std::string("model.moe_experts=") + (std::string(kind) == "moe" ? "4" : "0"),
        // A dense GPT takes no moe_* key but at its default.
        std::string("model.moe_every=") + (std::string(kind) == "moe" ? "2" : "1")};
    std::map<std::string, std::vector<double>> loss;
    std::map<std::string, std::vector<float>> params;
    std::map<std::string, std::uint64_t> acts;
    std::map<std::string, double> hw, model;
    for (const char* mode : {"none", "selective", "full", "op"}) {
      auto sets = base;
      sets.push_back(std::string("model.recompute=") + mode);
      const auto c = tiny_config(sets);
      core::MemoryTracker tracker;
      train::Trainer t(c, tracker, nullptr, 1e9);
      for (int s = 0; s < c.run.steps; ++s) {
        const auto r = t.step(s);
        loss[mode].push_back(r.loss);
        hw[mode] = r.hardware_flops;
        model[mode] = r.model_flops;
        EXPECT_GE(r.hfu, r.mfu);
      }
      params[mode] = t.strategy().full_params();
      acts[mode] = tracker.current(core::MemCategory::activations);
    }
    for (std::size_t s = 0; s < loss["none"].size(); ++s)
      EXPECT_NEAR(loss["op"][s], loss["none"][s], 1e-6 * loss["none"][s]) << "op: step " << s;
    for (std::size_t i = 0; i < params["none"].size(); ++i)
      ASSERT_NEAR(params["op"][i], params["none"][i], 1e-5 * (1 + std::fabs(params["none"][i]))) << "op: parameter " << i;
    for (const char* mode : {"selective", "full"}) {
      EXPECT_EQ(loss[mode], loss["none"]) << mode << ": losses bit for bit";
      EXPECT_EQ(params[mode], params["none"]) << mode << ": parameters bit for bit";
      EXPECT_EQ(model[mode], model["none"]);
    }
    // Bytes each block keeps without recomputation (fp32): the attention
    // probabilities B x NH x T x T; and with them every per-block buffer
    // full recomputation rebuilds: ln1, qkv, atty, res2, ln2 (N x C, 3C, C,
    // C, C), the two norms' mean and rstd (4 N), and for a dense block the
    // MLP hidden before and after GELU (2 N F); the block outputs stay.
    // The MLP hidden buffers exist for dense blocks only (block 1 of the MoE
    // model is a MoE block).
    const std::uint64_t att = 4ull * B * NH * T * T, hidden = 4ull * 2 * N * F;
    const std::uint64_t block = att + 4ull * (7ull * N * C + 4ull * N);
    const std::uint64_t dense_blocks = std::string(kind) == "moe" ? 2 : 3;
    EXPECT_EQ(acts["none"] - acts["selective"], (L - 1) * att);
    EXPECT_EQ(acts["none"] - acts["full"], (L - 1) * block + (dense_blocks - 1) * hidden);
    // Per-op (GELU): each block keeps q and v (2 N C), attention's output
    // and probabilities and the MLP's first linear's output (N F); one set
    // of the rest is rebuilt: ln1, qkv, res2, ln2, the norms' statistics,
    // and (dense blocks) the GELU output.
    const std::uint64_t rebuilt = 4ull * (6ull * N * C + 4ull * N), qv = 4ull * 2 * N * C, gelu = 4ull * N * F;
    EXPECT_EQ(acts["none"] - acts["op"], (L - 1) * rebuilt - L * qv + (dense_blocks - 1) * gelu);
    // Recomputed forward FLOPs per step: selective the attention core
    // (2 N T C twice) per block; full also QKV, the projection and (dense
    // blocks) the MLP's first linear. Global batch 4 sequences.
    const double Ng = 4.0 * T, core_flops = 2 * Ng * T * C * 2;
    EXPECT_DOUBLE_EQ(hw["selective"] - model["none"], L * core_flops);
    EXPECT_DOUBLE_EQ(hw["full"] - model["none"],
                     L * (core_flops + 2 * Ng * C * 3 * C + 2 * Ng * C * C) + double(dense_blocks) * 2 * Ng * C * F);
    // Per-op (GELU): k and the attention projection.
    EXPECT_DOUBLE_EQ(hw["op"] - model["none"], L * (2 * Ng * C * C + 2 * Ng * C * C));
  }
}

// torchtitan's per-op policy on Llama's block (grouped-query attention with
// RoPE, SwiGLU, no biases): k is rebuilt from its rows of the qkv weight and
// turned again, SwiGLU's up half from its rows of the first MLP weight;
// the run is the plain one to the last bits of those products (1e-6 of the
// losses; see the test above). Each block keeps q and v (N (C +
// KVC)), attention's output (N C) and probabilities, the gate half (N F)
// and the MLP's output (N C), where the plain run keeps ln1, qkv (N (C + 2
// KVC)), attention's output and probabilities, res2, ln2 (N C each), the
// norms' rstd (2 N) and the MLP's first linear before and after SwiGLU (N 3F).
TEST(Trainer, PerOpRecomputationOfLlamaBlocksIsExact) {
  const int L = 3, B = 2, T = 8, C = 16, KVC = C / 4 * 2, F = 40, N = B * T;
  std::map<std::string, std::vector<double>> loss;
  std::map<std::string, std::uint64_t> acts;
  std::map<std::string, double> hw;
  for (const char* mode : {"none", "op"}) {
    const auto c = tiny_config({"model.kind=llama", "model.layers=3", "model.heads=4", "model.kv_heads=2",
                                "model.ffn_dim=40", "model.rope_theta=10000", "data.micro_batch=2",
                                std::string("model.recompute=") + mode});
    core::MemoryTracker tracker;
    train::Trainer t(c, tracker, nullptr, 1e9);
    for (int s = 0; s < c.run.steps; ++s) {
      const auto r = t.step(s);
      loss[mode].push_back(r.loss);
      hw[mode] = r.hardware_flops - r.model_flops;
    }
    acts[mode] = tracker.current(core::MemCategory::activations);
  }
  for (std::size_t s = 0; s < loss["none"].size(); ++s)
    EXPECT_NEAR(loss["op"][s], loss["none"][s], 1e-6 * loss["none"][s]) << "step " << s;
  const std::uint64_t plain = 4ull * (std::uint64_t(N) * (C + C + 2 * KVC + C + C) + 2ull * N + 3ull * N * F);
  const std::uint64_t kept = 4ull * (std::uint64_t(N) * (C + KVC) + std::uint64_t(N) * F + std::uint64_t(N) * C);
  // One set of what is rebuilt stays: ln1, qkv, res2, ln2, the rstds, the
  // first linear's output and the SwiGLU output.
  const std::uint64_t one_set = plain;
  EXPECT_EQ(acts["none"] - acts["op"], L * (plain - kept) - one_set);
  // Recomputed: k (2 N C KVC), the attention projection (2 N C C) and the
  // up half (2 N C F) per block, over the global batch of 4 sequences.
  const double Ng = 4.0 * T;
  EXPECT_DOUBLE_EQ(hw["op"], L * (2 * Ng * C * KVC + 2 * Ng * C * C + 2 * Ng * C * F));
  EXPECT_DOUBLE_EQ(hw["none"], 0.0);
}

// A MoE block's MLP is its experts: the model holds the dense MLP's hidden
// activations for its dense blocks only.
TEST(Trainer, MoeBlocksHoldNoDenseMlpActivations) {
  const int B = 2, T = 8, F = 4 * 16, N = B * T;  // micro-batch, seq_len, 4 x d_model
  auto acts = [&](const std::vector<std::string>& sets) {
    core::MemoryTracker tracker;
    train::Trainer t(tiny_config(sets), tracker, nullptr, 0.0);
    return tracker.current(core::MemCategory::activations);
  };
  const std::vector<std::string> base = {"model.layers=4", "data.global_batch=4", "data.micro_batch=2",
                                         "model.kind=moe", "model.moe_experts=2", "model.moe_top_k=1"};
  auto with = [&](const char* every) {
    auto s = base;
    s.push_back(std::string("model.moe_every=") + every);
    return s;
  };
  // Two MoE blocks (every 2) against four (every 1): two more dense blocks,
  // each with its N x F hidden rows before and after GELU, and two fewer MoE
  // layers, each with its own buffers (models::moe_buffers).
  models::DecoderConfig gc = models::gpt_config(tiny_config(with("1")));
  std::uint64_t moe_layer = 0;
  for (const auto& b : models::moe_buffers(gc.moe_layer(), N))
    if (b.category == core::MemCategory::activations) moe_layer += 4ull * std::uint64_t(b.numel);
  EXPECT_EQ(acts(with("2")) + 2 * moe_layer, acts(with("1")) + 2 * 4ull * 2 * N * F);
}

// A resumed run's records start at its first global step, not at 0: the
// bubble is measured per global step (it once indexed per-record vectors by
// the global step and read past their end).
TEST(RunReport, BubbleOfAResumedRunIsTheSameAsFromStepZero) {
  const auto& schedule = strategies::pp::find_schedule("1f1b");
  auto measure = [&](int first) {
    prof::Timeline tl;
    std::vector<train::StepRecord> steps;
    for (int i = 0; i < 4; ++i) {
      const int s = first + i;
      const double t0 = 10.0 * i;
      tl.add({s, 0, 0, 1, prof::Phase::forward, t0, t0 + 1.0 + i});
      tl.add({s, 0, 0, 1, prof::Phase::backward, t0 + 3.0, t0 + 5.0});
      tl.add({s, 0, 0, -1, prof::Phase::optimizer, t0 + 7.0, t0 + 8.0});
      train::StepRecord r;
      r.step = s, r.warmup = i == 0, r.step_time = 8.0;
      steps.push_back(r);
    }
    return train::measure_bubble(tl, steps, 0, 2, 4, 1, schedule);
  };
  const train::Bubble a = measure(0), b = measure(1000);
  // Steps 1..3: pipeline 7 s, busy 4, 5, 6 s: idle 3, 2, 1: the median 2/7.
  EXPECT_DOUBLE_EQ(a.idle_over_step, 2.0 / 7.0);
  EXPECT_DOUBLE_EQ(b.idle_over_step, a.idle_over_step);
  EXPECT_DOUBLE_EQ(b.idle_over_compute, a.idle_over_compute);
}

// /summary/comm keeps message sizes apart: scalars and buckets of one axis
// and op are different rows, each with its own bandwidth.
TEST(RunReport, CommSummaryKeepsScalarsApartFromBuckets) {
  EXPECT_EQ(train::size_class(0), 0);
  EXPECT_EQ(train::size_class(1), 1);
  EXPECT_EQ(train::size_class(8), 8);
  EXPECT_EQ(train::size_class(9), 16);
  EXPECT_EQ(train::size_class(std::int64_t(4) << 20), std::int64_t(4) << 20);
  EXPECT_EQ(train::size_class((std::int64_t(4) << 20) + 1), std::int64_t(8) << 20);
  comm::CommLog log(0.0);
  log.set_step(1);
  const std::int64_t bucket = std::int64_t(4) << 20;
  for (int i = 0; i < 3; ++i) log.add({1, "all_reduce", "dp", 2, bucket, false, 0.0, 0.002, 0.002, 0.0, 0.0, 0.002});
  for (int i = 0; i < 5; ++i) log.add({1, "all_reduce", "dp", 2, 8, false, 0.0, 0.001, 0.001, 0.0, 0.0, 0.001});
  const auto rows = train::aggregate_comm(log, 0);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].size_class, bucket);
  EXPECT_EQ(rows[0].count, 3);
  EXPECT_DOUBLE_EQ(rows[0].algbw(), 3.0 * double(bucket) / 0.006);  // the scalars' milliseconds are not in it
  EXPECT_EQ(rows[1].size_class, 8);
  EXPECT_EQ(rows[1].count, 5);
}

// A non-blocking bucket issued at 0 and seen complete at 10 ms, of which 2 ms
// were its transfer (the rest was backward compute it overlapped): the
// bandwidth is the transfer's, the span only says how long it was in flight.
TEST(RunReport, CommBandwidthComesFromTheTransferNotTheSpan) {
  comm::CommLog log(0.0);
  const std::int64_t bucket = std::int64_t(4) << 20;
  log.add({0, "all_reduce", "dp", 2, bucket, true, 0.0, 0.010, 0.001, 0.0, 0.008, 0.010});
  const auto rows = train::aggregate_comm(log, 0);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_DOUBLE_EQ(rows[0].time, 0.002);
  EXPECT_DOUBLE_EQ(rows[0].span, 0.010);
  EXPECT_DOUBLE_EQ(rows[0].algbw(), double(bucket) / 0.002);
  EXPECT_DOUBLE_EQ(rows[0].busbw(), double(bucket) / 0.002);  // 2(n-1)/n = 1 for n = 2
  EXPECT_DOUBLE_EQ(rows[0].hidden_fraction(), 0.9);
}
