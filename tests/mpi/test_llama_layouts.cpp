// The Llama family (RMSNorm, grouped-query attention with RoPE, SwiGLU, an
// untied head; Mixtral's MoE blocks) on every layout, against the
// single-rank run, under mpiexec with 2 or 4 ranks: one table of layouts,
// each run where the world has its size. fp32: the loss trajectory of 10
// steps within 1e-5 relative (clipping active), every parameter tensor
// within its layout's norm-wise bound of the single-rank run's (the bounds
// of the GPT's parity tests, for the same reasons: see bound()), and the
// dry run's estimate equal to what the run measured, memory and
// communication. bf16 and fp16: the trajectory within test_mixed_precision's
// bounds of the fp32 single-rank run (why: there).
//
// The model: 4 query heads sharing 2 key-value heads (so tp 2 splits both),
// head size 4, a SwiGLU width of 24 (not a multiple of d_model).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "kernels/foundation/clock.hpp"
#include "src/comm/comm_log.hpp"
#include "src/deck/deck.hpp"
#include "src/mesh/mesh.hpp"
#include "src/train/trainer.hpp"
#include "strategies/registry.hpp"
#include "tests/mpi/estimate_check.hpp"
#include "tests/mpi/parity.hpp"

using namespace strata;

namespace {

struct Layout {
  int dp = 1, tp = 1, pp = 1, cp = 1, ep = 1;
  int zero = 0, dp_shard = 0;
  bool sp = false;
  const char* schedule = "1f1b";
  int v = 1;                    // virtual stages
  int first = -1, last = -1;    // the first and last stages' blocks (-1: balanced)
  const char* recompute = "none";
  const char* offload = "none";
  const char* precision = "fp32";
  int experts = 0;              // Mixtral's MoE blocks (every other block)
  int world() const { return dp * tp * pp * cp; }
  std::string label() const {
    return fmt::format("dp {} tp {}{} pp {} {} v {} first {} last {} cp {} ep {} zero {} dp_shard {} recompute {} "
                       "offload {} {}{}",
                       dp, tp, sp ? " sp" : "", pp, schedule, v, first, last, cp, ep, zero, dp_shard, recompute,
                       offload, precision, experts > 0 ? " mixtral" : "");
  }
};

// Four micro-batches of two sequences per dp rank; four blocks.
plan::Plan config(const Layout& l) {
  const int mb = 2, m = 4, G = m * mb * l.dp;
  const std::string offload_dir = std::filesystem::temp_directory_path().string();
  const std::string text = fmt::format(
      "[run]\nsteps = 10\nwarmup_steps = 0\nseed = 23\n"
      "[model]\nkind = \"llama\"\nlayers = 4\nd_model = 16\nheads = 4\nkv_heads = 2\nffn_dim = 24\nvocab = 256\n"
      "seq_len = 16\nrope_theta = 10000\nrecompute = \"{}\"\nmoe_experts = {}\nmoe_every = 2\n"
      "[data]\nsource = \"text\"\npath = \"/usr/share/common-licenses/GPL-3\"\nglobal_batch = {}\nmicro_batch = {}\n"
      "[parallel]\ndp = {}\ntp = {}\npp = {}\ncp = {}\nep = {}\nzero = {}\ndp_shard = {}\nsequence_parallel = {}\n"
      "schedule = \"{}\"\nvirtual_stages = {}\nfirst_stage_layers = {}\nlast_stage_layers = {}\noffload = \"{}\"\n"
      "bucket_mb = 0.004\n"
      "[optim]\nlr = 1e-2\nweight_decay = 0.1\ngrad_clip = 1.0\nschedule = \"cosine\"\nwarmup = 2\n"
      "[backend]\nthreads = 1\nprecision = \"{}\"\n"
      "[offload]\npath = \"{}\"\n",
      l.recompute, l.experts, G, mb, l.dp, l.tp, l.pp, l.cp, l.ep, l.zero, l.dp_shard, l.sp, l.schedule, l.v, l.first,
      l.last, l.offload, l.precision, offload_dir);
  return deck::parse_deck("llama.toml", text, {}).config;
}

// The norm-wise bound on a parameter tensor after 10 steps, as the GPT's
// parity tests set them for the same layouts: Adam turns the rounding of
// gradient elements summed in another order into updates of ~lr, more so
// the more the order changes. dp, tp and ZeRO 1e-5 (test_state_strategies,
// test_tensor_parallel); pipelines 2e-5 (test_pipeline); the ring's
// block-by-block softmax 5e-5 (test_context_parallel); experts that run
// over several micro-batches' rows at once 5e-4 (test_moe_ep).
double bound(const Layout& l) {
  if (l.ep > 1) return 5e-4;
  if (l.cp > 1) return 5e-5;
  if (l.pp > 1) return 2e-5;
  return 1e-5;
}

void check(const Layout& l) {
  if (l.world() != parity::world_size()) return;
  SCOPED_TRACE(l.label());
  Layout one;
  one.recompute = l.recompute, one.experts = l.experts;
  plan::Plan rc = config(one);
  rc.data.global_batch = config(l).data.global_batch;
  core::MemoryTracker rt;
  train::Trainer ref(rc, rt, nullptr, 0.0);
  std::vector<train::StepRecord> want;
  for (int s = 0; s < rc.run.steps; ++s) want.push_back(ref.step(s));

  const auto c = config(l);
  comm::CommLog log(prof::now_seconds());
  mesh::Mesh mesh(MPI_COMM_WORLD, strategies::layout_of(c), log);
  core::MemoryTracker tracker;
  train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
  const bool fp32 = std::string(l.precision) == "fp32";
  const double loss_tol = fp32 ? 1e-5 : 1e-2;
  int clipped = 0;
  std::vector<train::StepRecord> got;
  for (int s = 0; s < c.run.steps; ++s) {
    estimate_check::begin_step(tracker, &log, s);
    got.push_back(t.step(s));
    clipped += got.back().clipped;
    EXPECT_NEAR(got.back().loss, want[std::size_t(s)].loss, loss_tol * std::fabs(want[std::size_t(s)].loss))
        << "step " << s;
    EXPECT_NEAR(got.back().grad_norm, want[std::size_t(s)].grad_norm, loss_tol * want[std::size_t(s)].grad_norm)
        << "step " << s;
  }
  EXPECT_LT(got.back().loss, got.front().loss - 0.5) << "the loss falls";
  if (fp32) {
    EXPECT_GT(clipped, 0) << "the test should exercise clipping";
  }
  estimate_check::expect_estimate_is_measured(c, tracker, t, &log, c.run.steps - 1);
  // Mixed precision: test_mixed_precision's per-tensor bounds (dense 0.15,
  // MoE 0.3: a rounded router logit can flip a token's choice), but 0.75 for
  // Mixtral's: its router is this model's smallest tensor (4 x 16 weights),
  // where a flipped choice weighs most, and its input and logits are held in
  // bf16 as Megatron's default router and torchtitan's gate hold them
  // (measured 0.58 on the last block's router, bf16 dp 2 x ep 2, with the
  // whole vector at 4.3e-2, within the bound below).
  const double tol = fp32 ? bound(l) : l.experts > 0 ? 0.75 : 0.15;
  double key_abs = 0;
  std::string worst;
  EXPECT_LE(parity::params_error(t.registry(), t.strategy().full_params(), ref.registry(),
                                 ref.strategy().full_params(), &key_abs, &worst),
            tol)
      << worst;
  // And over the whole parameter vector (test_mixed_precision's bounds:
  // dense 2e-2, MoE 5e-2).
  const std::vector<float> mine = t.strategy().full_params(), theirs = ref.strategy().full_params();
  double diff = 0, norm = 0;
  for (const auto& s : t.registry().specs()) {
    const auto& w = ref.registry().find(s.name);
    for (std::int64_t k = 0; k < s.numel; ++k) {
      const double x = theirs[std::size_t(w.offset + s.global_index(k))], d = mine[std::size_t(s.offset + k)] - x;
      diff += d * d;
      norm += x * x;
    }
  }
  const double whole = std::sqrt(diff / norm);
  EXPECT_LE(whole, fp32 ? bound(l) : l.experts > 0 ? 5e-2 : 2e-2);
  if (mpi_test::world_rank() == 0)
    fmt::print("{}: final loss {:.6f} (one rank {:.6f}); parameters {:.2e} (whole)\n", l.label(), got.back().loss,
               want.back().loss, whole);
}

}  // namespace

// Every state strategy: dp, ZeRO 1-3, hybrid sharding; offload to the host
// and to NVMe.
TEST(Llama, DataParallelAndZeroMatchOneRank) {
  for (int zero = 0; zero <= 3; ++zero) check({.dp = 2, .zero = zero});
  check({.dp = 4, .zero = 3, .dp_shard = 2});
  check({.dp = 2, .zero = 1, .offload = "host"});
  check({.dp = 2, .zero = 3, .offload = "nvme"});
}

// Tensor parallelism splits the query heads and the key-value heads (and
// SwiGLU's gate and up halves), with and without sequence parallelism;
// context parallelism's ring carries the key-value heads only.
TEST(Llama, TensorAndContextParallelMatchOneRank) {
  check({.tp = 2});
  check({.tp = 2, .sp = true});
  check({.cp = 2});
  check({.cp = 2, .recompute = "full"});
  check({.dp = 2, .tp = 2, .zero = 1, .sp = true});
  check({.tp = 2, .cp = 2});
}

// Every schedule, the first and last stages uneven (the first holds the
// embedding, the last the untied head), and a pipeline over tp.
TEST(Llama, PipelinesMatchOneRank) {
  for (const char* s : {"gpipe", "1f1b", "zb-h1"}) check({.pp = 2, .schedule = s});
  check({.pp = 2, .schedule = "interleaved", .v = 2});
  check({.pp = 2, .schedule = "zb-v", .v = 2});
  check({.pp = 2, .first = 1, .last = 3});
  check({.pp = 2, .first = 0, .last = 4, .recompute = "selective"});
  check({.tp = 2, .pp = 2, .sp = true});
  check({.dp = 2, .pp = 2, .zero = 2});
}

// Mixtral's MoE blocks on one rank's worth of experts and split over ep.
TEST(Llama, MixtralExpertsMatchOneRank) {
  check({.dp = 2, .experts = 4});
  check({.dp = 2, .ep = 2, .experts = 4});
  check({.dp = 4, .ep = 2, .zero = 1, .experts = 4});
  check({.dp = 2, .tp = 2, .ep = 2, .experts = 4});
}

// Recomputation, and mixed precision against the fp32 single-rank run.
TEST(Llama, RecomputationAndMixedPrecisionTrackOneRank) {
  check({.dp = 2, .recompute = "selective"});
  check({.dp = 2, .recompute = "full"});
  // torchtitan's per-op policy: k and SwiGLU's up half rebuilt from their
  // rows of the weights, over tp with sequence-parallel norms, and on MoE.
  check({.dp = 2, .recompute = "op"});
  check({.tp = 2, .sp = true, .recompute = "op"});
  check({.dp = 2, .ep = 2, .recompute = "op", .experts = 4});
  check({.dp = 2, .zero = 1, .precision = "bf16"});
  check({.dp = 2, .zero = 3, .precision = "fp16"});
  check({.tp = 2, .pp = 2, .sp = true, .precision = "bf16"});
  check({.dp = 2, .ep = 2, .precision = "bf16", .experts = 4});
}
