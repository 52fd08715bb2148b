// Mixed precision (backend.precision = bf16 | fp16) under mpiexec with N
// ranks: the trajectory within 1e-2 of the fp32 single-rank run after 10
// steps, loss falling, under dp, every ZeRO stage, and a tp x pp and an
// expert-parallel layout; the per-rank bytes of parameters, gradients and
// optimizer state equal to ZeRO's mixed-precision figures (2 + 2 + 12 per
// parameter) to the byte; and fp16's dynamic loss scaling skipping
// overflowing steps on every rank alike. (16-bit collective volumes and
// offload in mixed precision: test_state_strategies, beside fp32's.)
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "src/comm/comm_log.hpp"
#include "src/deck/deck.hpp"
#include "src/mesh/mesh.hpp"
#include "kernels/foundation/clock.hpp"
#include "src/train/trainer.hpp"
#include "tests/mpi/estimate_check.hpp"
#include "tests/mpi/parity.hpp"
#include "tests/mpi/mpi_world.hpp"

using namespace strata;
using core::MemCategory;

namespace {

// The state-strategy tests' tiny GPT (d_model 16: units divisible by 4;
// 6: shards padded), on text so that the loss can fall, with a mesh and a
// precision; MoE when experts > 0.
struct Sizes {
  int pp = 1, dp = 1, tp = 1, ep = 1, cp = 1;
};

plan::Plan config(Sizes l, int zero, int d_model, int global_batch, int micro_batch, int steps,
                    const std::string& precision, int experts = 0) {
  std::string text = fmt::format(
      "[run]\nsteps = {}\nwarmup_steps = 0\nseed = 21\n"
      "[model]\nlayers = 2\nd_model = {}\nheads = 2\nvocab = 256\nseq_len = 8\n{}"
      "[data]\nsource = \"text\"\npath = \"/usr/share/common-licenses/GPL-3\"\nglobal_batch = {}\nmicro_batch = {}\n"
      "[parallel]\npp = {}\ndp = {}\ntp = {}\nep = {}\ncp = {}\nzero = {}\nbucket_mb = 0.004\n"
      "[optim]\nlr = 1e-2\nweight_decay = 0.1\ngrad_clip = 1.0\nschedule = \"cosine\"\nwarmup = 2\n"
      "[backend]\nthreads = 1\nprecision = \"{}\"\n",
      steps, d_model, experts > 0 ? fmt::format("kind = \"moe\"\nmoe_experts = {}\nmoe_every = 2\n", experts) : "",
      global_batch, micro_batch, l.pp, l.dp, l.tp, l.ep, l.cp, zero, precision);
  return deck::parse_deck("test.toml", text, {}).config;
}

struct Trajectory {
  std::vector<train::StepRecord> steps;
  std::vector<float> params;
  models::ParamRegistry registry;
};

Trajectory run(const plan::Plan& c, mesh::Mesh* mesh) {
  core::MemoryTracker tracker;
  std::unique_ptr<train::Trainer> t;
  if (mesh == nullptr)
    t = std::make_unique<train::Trainer>(c, tracker, nullptr, 0.0);
  else
    t = std::make_unique<train::Trainer>(c, tracker, nullptr, 0.0, strategies::parallelize(c, mesh));
  Trajectory r;
  for (int s = 0; s < c.run.steps; ++s) {
    estimate_check::begin_step(tracker, nullptr, s);
    r.steps.push_back(t->step(s));
  }
  estimate_check::expect_estimate_is_measured(c, tracker, *t);
  r.params = t->strategy().full_params();
  r.registry = t->registry();
  return r;
}

// The mixed-precision run against the fp32 single-rank run: every loss and
// every gradient norm within 1e-2 relative (the norm catches a loss scale
// left in the gradients, to which Adam itself is blind), the loss falling;
// the master weights close over the whole parameter vector (`whole`) and
// norm-wise per tensor (`tensor`). bf16 keeps 8 significant bits: every
// activation the backward reads is stored rounded to them, each gradient
// element is rounded by up to 2^-9 relative, Adam's per-element
// normalisation turns that into updates of ~lr whatever the gradient's
// size, and tensors of small norm (the biases, which start at zero) show it
// most. Dense: whole 2e-2, tensor 0.15 (measured after 10 steps at lr 1e-2:
// whole <= 1.5e-2 on dp 2 x cp 2, tensor <= 0.09). MoE: whole 5e-2,
// tensor 0.3, because a rounded router logit can flip a token's top-2
// choice or its drop, a discrete change (measured 4.1e-2, 0.29). The same
// flips move MoE's gradient norm by more than rounding would: one token
// changing experts changes that expert's gradient by a whole token's part,
// so its norm bound is 8e-2 (measured 5.4e-2 at dp 2 x ep 2); every loss
// stays within 1e-2.
void expect_close(const Trajectory& mixed, const Trajectory& ref, const std::string& what, double whole_bound = 2e-2,
                  double tensor_bound = 0.15, double norm_bound = 1e-2) {
  ASSERT_EQ(mixed.steps.size(), ref.steps.size());
  double worst_norm = 0;
  for (std::size_t s = 0; s < ref.steps.size(); ++s) {
    EXPECT_NEAR(mixed.steps[s].loss, ref.steps[s].loss, 1e-2 * std::fabs(ref.steps[s].loss)) << what << " step " << s;
    EXPECT_NEAR(mixed.steps[s].grad_norm, ref.steps[s].grad_norm, norm_bound * ref.steps[s].grad_norm)
        << what << " step " << s;
    worst_norm = std::max(worst_norm, std::fabs(mixed.steps[s].grad_norm / ref.steps[s].grad_norm - 1));
  }
  EXPECT_LT(mixed.steps.back().loss, mixed.steps.front().loss - 0.5) << what << ": the loss falls";
  double key_abs = 0, diff = 0, norm = 0;
  std::string worst;
  const double e = parity::params_error(mixed.registry, mixed.params, ref.registry, ref.params, &key_abs, &worst);
  EXPECT_LE(e, tensor_bound) << what << " (worst tensor " << worst << ")";
  for (const auto& s : mixed.registry.specs()) {
    const auto& w = ref.registry.find(s.name);
    for (std::int64_t k = 0; k < s.numel; ++k) {
      const double want = ref.params[std::size_t(w.offset + s.global_index(k))];
      diff += (mixed.params[std::size_t(s.offset + k)] - want) * (mixed.params[std::size_t(s.offset + k)] - want);
      norm += want * want;
    }
  }
  const double whole = std::sqrt(diff / norm);
  EXPECT_LE(whole, whole_bound) << what;
  if (mpi_test::world_rank() == 0)
    fmt::print("{}: final loss {:.6f} vs fp32 {:.6f}; gradient norm within {:.2e}; parameters {:.2e} (whole), "
               "{:.2e} ({})\n",
               what, mixed.steps.back().loss, ref.steps.back().loss, worst_norm, whole, e, worst);
}

std::int64_t shard_elems(const std::vector<models::Unit>& units, int n) {
  std::int64_t s = 0;
  for (const auto& u : units) s += (u.size() + n - 1) / n;
  return s;
}

// What a rank holds after a step, with the model's sizes: Psi, the shard S
// (units padded to n blocks), Psi_p = n S; the bytes of parameters,
// gradients and optimizer state.
struct Held {
  std::uint64_t psi, S, psi_p, params, grads, opt;
};
Held held(const train::Trainer& t, const core::MemoryTracker& tracker, int n) {
  const std::uint64_t S = std::uint64_t(shard_elems(t.units(), n));
  return {std::uint64_t(t.registry().numel()), S, S * n, tracker.current(MemCategory::params),
          tracker.current(MemCategory::grads), tracker.current(MemCategory::optimizer)};
}

}  // namespace

TEST(MixedPrecision, DataParallelAndZeroTrackFp32) {
  const int n = parity::world_size(), mb = 2, G = 2 * mb * n;
  const Trajectory ref = run(config({1, 1, 1}, 0, 16, G, mb, 10, "fp32"), nullptr);
  comm::CommLog log(prof::now_seconds());
  mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(1, n, 1), log);
  for (const std::string precision : {"bf16", "fp16"})
    for (int zero = 0; zero <= 3; ++zero) {
      const Trajectory r = run(config({1, n, 1}, zero, 16, G, mb, 10, precision), &mesh);
      int skipped = 0;
      for (const auto& s : r.steps) skipped += s.skipped;
      EXPECT_EQ(skipped, 0) << "the default loss scale fits this model's gradients";
      expect_close(r, ref, fmt::format("{} dp {} zero {}", precision, n, zero));
    }
}

// On 2 ranks pp 2 and MoE dp 2 x ep 2; on 4, pp 2 x tp 2 (SP) and dp 4 x ep 2.
TEST(MixedPrecision, TensorPipelineAndExpertLayoutsTrackFp32) {
  const int n = parity::world_size();
  {
    const Trajectory ref = run(config({1, 1, 1}, 0, 16, 8, 2, 10, "fp32"), nullptr);
    const Sizes l{2, 1, n / 2};
    comm::CommLog log(prof::now_seconds());
    mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(l.pp, l.dp, l.tp), log);
    auto c = config(l, 0, 16, 8, 2, 10, "bf16");
    c.parallel.sequence_parallel = l.tp > 1;
    expect_close(run(c, &mesh), ref, fmt::format("bf16 pp 2 x tp {}", l.tp));
  }
  {
    const Trajectory ref = run(config({1, 1, 1}, 0, 16, 8, 2, 10, "fp32", 4), nullptr);
    const Sizes l{1, n, 1, 2};
    comm::CommLog log(prof::now_seconds());
    mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(l.pp, l.dp, l.tp, l.ep), log);
    expect_close(run(config(l, 2, 16, 8, 2, 10, "bf16", 4), &mesh), ref, fmt::format("bf16 MoE dp {} x ep 2, zero 2", n), 5e-2, 0.3,
                 8e-2);
  }
  {
    const Trajectory ref = run(config({1, 1, 1}, 0, 16, 8, 2, 10, "fp32"), nullptr);
    const Sizes l{.dp = n / 2, .cp = 2};
    comm::CommLog log(prof::now_seconds());
    mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(1, l.dp, 1, 1, 0, l.cp), log);
    expect_close(run(config(l, 1, 16, 8, 2, 10, "bf16"), &mesh), ref, fmt::format("bf16 dp {} x cp 2, zero 1", n / 2));
  }
}

// Activations and their gradients are kept, and cross ranks, in the compute
// precision: under bf16 every pipeline transfer, ring-attention block,
// sequence-parallel gather and reduce-scatter and expert exchange moves
// exactly half the bytes of the same step in fp32. What stays fp32 stays
// equal: the vocabulary-parallel cross-entropy's statistics and the
// replicated parameters' gradients (tp all_reduce), the expert counts
// (ep all_to_all).
TEST(Activations, CrossRanksInHalfTheBytes) {
  const int n = parity::world_size();
  struct Case {
    Sizes l;
    int experts;
    std::vector<std::string> halved, same;
  };
  std::vector<Case> cases = {
      {{.pp = 2, .tp = n / 2}, 0, {"pp send", "pp recv"}, {}},
      {{.dp = n / 2, .cp = 2}, 0, {"cp send", "cp recv"}, {}},
      {{.dp = n, .ep = 2}, 4, {"ep all_to_allv"}, {"ep all_to_all"}},
  };
  if (n >= 4) {
    cases[0].halved.insert(cases[0].halved.end(), {"tp all_gather", "tp reduce_scatter"});
    cases[0].same.push_back("tp all_reduce");
  }
  for (const Case& k : cases) {
    std::map<std::string, std::int64_t> bytes[2];
    for (int half = 0; half < 2; ++half) {
      comm::CommLog log(prof::now_seconds());
      mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(k.l.pp, k.l.dp, k.l.tp, k.l.ep, 0, k.l.cp), log);
      auto c = config(k.l, 0, 16, 8, 2, 1, half ? "bf16" : "fp32", k.experts);
      c.parallel.sequence_parallel = k.l.tp > 1;
      core::MemoryTracker tracker;
      train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
      log.set_step(0);
      const std::size_t before = log.records().size();
      estimate_check::begin_step(tracker, nullptr, 0);
      t.step(0);
      for (std::size_t i = before; i < log.records().size(); ++i) {
        const auto& r = log.records()[i];
        bytes[half][std::string(r.axis) + " " + std::string(r.op)] += r.bytes;
      }
      estimate_check::expect_estimate_is_measured(c, tracker, t);
    }
    for (const auto& op : k.halved) {
      EXPECT_GT(bytes[0][op], 0) << op;
      EXPECT_EQ(2 * bytes[1][op], bytes[0][op]) << op;
    }
    for (const auto& op : k.same) EXPECT_EQ(bytes[1][op], bytes[0][op]) << op;
  }
}

// ZeRO's mixed-precision figures (Rajbhandari et al., 2020, with K = 12):
// dp 2 + 2 + 12 = 16 Psi; stage 1 4 Psi + 12 Psi/N; stage 2 2 Psi + 14 Psi/N;
// stage 3 16 Psi/N; held at the end of a step. The fp32 views the CPU
// kernels read are workspace, gone by then.
TEST(MixedPrecision, PerRankBytesAreZerosMixedPrecisionFigures) {
  const int n = parity::world_size();
  comm::CommLog log(prof::now_seconds());
  mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(1, n, 1), log);
  for (const std::string precision : {"bf16", "fp16"})
    for (int d_model : {16, 6})
      for (int zero = 0; zero <= 3; ++zero) {
        SCOPED_TRACE(fmt::format("{} d_model {} zero {}", precision, d_model, zero));
        const auto c = config({1, n, 1}, zero, d_model, 2 * n, 2, 1, precision);
        core::MemoryTracker tracker;
        train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
        const std::size_t workspace_before = tracker.current(MemCategory::workspace);
        t.step(0);
        const auto [psi, S, psi_p, params, grads, opt] = held(t, tracker, n);
        switch (zero) {
          case 0: EXPECT_EQ(params, 2 * psi); EXPECT_EQ(grads, 2 * psi); EXPECT_EQ(opt, 12 * psi); break;
          case 1: EXPECT_EQ(params + grads, 4 * psi_p); EXPECT_EQ(opt, 12 * S); break;
          case 2: EXPECT_EQ(params, 2 * psi_p); EXPECT_EQ(grads + opt, 14 * S); break;
          case 3: EXPECT_EQ(params + grads + opt, 16 * S); EXPECT_EQ(params, 2 * S); break;
        }
        EXPECT_EQ(tracker.current(MemCategory::comm), 0u);
        EXPECT_EQ(tracker.current(MemCategory::workspace), workspace_before) << "no fp32 view outlives its use";
        EXPECT_GT(tracker.peak(MemCategory::workspace), workspace_before) << "the kernels read fp32 views";
      }
}

// parallel.grad_reduce = "fp32" (Megatron-LM's default under bf16): the
// gradients are accumulated, held and reduced in fp32 while parameters stay
// 16-bit. Held at the end of a step: dp 2 + 4 + 12 = 18 Psi; stage 1
// 6 Psi + 12 Psi/N (Megatron-LM's distributed optimizer's 6 + 12/d);
// stage 2 2 Psi + 16 Psi/N; stage 3 18 Psi/N. The gradient reduction moves
// 4 bytes an element, twice grad_reduce = "compute"'s; the parameter
// all-gathers are the same 16-bit ones. The trajectory tracks fp32's within
// the bounds of 16-bit gradients (expect_close), and the dry run's estimate
// is the measurement (run()).
TEST(MixedPrecision, Fp32GradientsAreHeldAndReducedInFourBytes) {
  const int n = parity::world_size(), mb = 2, G = 2 * mb * n;
  comm::CommLog log(prof::now_seconds());
  mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(1, n, 1), log);
  for (const std::string precision : {"bf16", "fp16"})
    for (int zero = 0; zero <= 3; ++zero) {
      SCOPED_TRACE(fmt::format("{} zero {}", precision, zero));
      std::map<std::string, std::int64_t> bytes[2];
      for (int fp32 = 0; fp32 < 2; ++fp32) {
        auto c = config({1, n, 1}, zero, 6, 2 * n, 2, 1, precision);
        c.parallel.grad_reduce = fp32 ? plan::GradReduce::fp32 : plan::GradReduce::compute;
        core::MemoryTracker tracker;
        train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
        log.set_step(0);
        const std::size_t before = log.records().size();
        t.step(0);
        for (std::size_t i = before; i < log.records().size(); ++i)
          bytes[fp32][std::string(log.records()[i].op)] += log.records()[i].bytes;
        if (!fp32) continue;
        const auto [psi, S, psi_p, params, grads, opt] = held(t, tracker, n);
        switch (zero) {
          case 0: EXPECT_EQ(params, 2 * psi); EXPECT_EQ(grads, 4 * psi); EXPECT_EQ(opt, 12 * psi); break;
          case 1: EXPECT_EQ(params, 2 * psi_p); EXPECT_EQ(grads, 4 * psi_p); EXPECT_EQ(opt, 12 * S); break;
          case 2: EXPECT_EQ(params, 2 * psi_p); EXPECT_EQ(grads, 4 * S); EXPECT_EQ(opt, 12 * S); break;
          case 3: EXPECT_EQ(params, 2 * S); EXPECT_EQ(grads, 4 * S); EXPECT_EQ(opt, 12 * S); break;
        }
        EXPECT_EQ(tracker.current(MemCategory::comm), 0u);
        if (zero == 0) {
          // One all-reduce of every gradient (besides the loss's and the norm's scalars).
          EXPECT_EQ(bytes[1]["all_reduce"] - bytes[0]["all_reduce"], std::int64_t(2 * psi));
        } else {
          EXPECT_GT(bytes[0]["reduce_scatter"], 0);
          EXPECT_EQ(bytes[1]["reduce_scatter"], 2 * bytes[0]["reduce_scatter"]);
          EXPECT_EQ(bytes[1]["all_gather"], bytes[0]["all_gather"]) << "the parameters stay 16-bit";
        }
      }
    }
  const Trajectory ref = run(config({1, 1, 1}, 0, 16, G, mb, 10, "fp32"), nullptr);
  for (const std::string precision : {"bf16", "fp16"})
    for (int zero = 0; zero <= 3; ++zero) {
      auto c = config({1, n, 1}, zero, 16, G, mb, 10, precision);
      c.parallel.grad_reduce = plan::GradReduce::fp32;
      expect_close(run(c, &mesh), ref, fmt::format("{} dp {} zero {} grad_reduce fp32", precision, n, zero));
    }
  // ZeRO-Offload's division with fp32 gradients: 4 bytes a gradient to the
  // host, the update there, the 16-bit parameters back.
  auto c = config({1, n, 1}, 2, 16, G, mb, 10, "bf16");
  c.parallel.grad_reduce = plan::GradReduce::fp32;
  c.parallel.offload = plan::Offload::host;
  expect_close(run(c, &mesh), ref, fmt::format("bf16 dp {} zero 2 offload host grad_reduce fp32", n));
}

// fp16 dynamic loss scaling from a scale far too large (2^20: the scaled
// gradients overflow fp16's 65504): the first steps are skipped on every
// rank, each halving the scale and leaving parameters and optimizer state
// untouched; once the gradients fit, steps apply and the scale doubles after
// every `window` good ones.
TEST(MixedPrecision, Fp16LossScalingSkipsOverflowingSteps) {
  const int n = parity::world_size();
  comm::CommLog log(prof::now_seconds());
  mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(1, n, 1), log);
  auto c = config({1, n, 1}, 2, 16, 2 * n, 2, 20, "fp16");
  c.backend.loss_scale = std::ldexp(1.0, 20);
  c.backend.loss_scale_window = 3;
  core::MemoryTracker tracker;
  train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
  std::vector<float> before = t.strategy().full_params();
  double scale = c.backend.loss_scale;
  int skipped = 0, good = 0;
  for (int s = 0; s < c.run.steps; ++s) {
    const auto r = t.step(s);
    EXPECT_EQ(r.loss_scale, scale) << "step " << s;
    int mine = r.skipped, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_TRUE(all == 0 || all == n) << "every rank skips alike";
    const std::vector<float> after = t.strategy().full_params();
    if (r.skipped) {
      EXPECT_FALSE(std::isfinite(r.grad_norm));
      EXPECT_EQ(after, before) << "a skipped step changes no parameter";
      ++skipped;
      scale /= 2;
    } else {
      EXPECT_TRUE(std::isfinite(r.grad_norm));
      EXPECT_NE(after, before);
      if (++good % c.backend.loss_scale_window == 0) scale *= 2;
    }
    before = after;
  }
  EXPECT_GE(skipped, 2) << "2^20 times this model's largest gradients (above 0.1) overflows fp16";
  EXPECT_GT(good, c.backend.loss_scale_window) << "the scale has grown again";
  EXPECT_EQ(t.scaler().skipped_steps, skipped);
  EXPECT_EQ(t.scaler().scale, scale);
}
