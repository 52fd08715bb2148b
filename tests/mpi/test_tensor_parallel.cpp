// Tensor parallelism (Megatron-style, with vocabulary-parallel embedding and
// cross-entropy) against the single-rank run, under mpiexec: tp over all
// ranks, and tp x dp with each ZeRO stage at 4 ranks. The loss trajectory of
// 10 steps (accumulation and clipping active) within 1e-5 relative, every
// rank's parameter shard equal to its slice of the single-rank parameters,
// and the bytes on the tp axis equal to Megatron's count.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <map>
#include <string>

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

namespace {

plan::Plan config(int dp, int tp, int zero, int global_batch, int micro_batch, int steps = 10, bool sp = false) {
  const std::string text = fmt::format(
      "[run]\nsteps = {}\nwarmup_steps = 0\nseed = 5\n"
      "[model]\nlayers = 2\nd_model = 16\nheads = 4\nvocab = 32\nseq_len = 8\n"
      "[data]\nglobal_batch = {}\nmicro_batch = {}\n"
      "[parallel]\ndp = {}\ntp = {}\nzero = {}\nsequence_parallel = {}\n"
      "[optim]\nlr = 1e-2\nweight_decay = 0.1\ngrad_clip = 0.1\n"
      "[backend]\nthreads = 1\n",
      steps, global_batch, micro_batch, dp, tp, zero, sp);
  return deck::parse_deck("test.toml", text, {}).config;
}

struct Reference {
  std::vector<double> losses;
  std::vector<float> params;
  models::ParamRegistry registry;
};

Reference single_rank(const plan::Plan& c) {
  core::MemoryTracker tracker;
  train::Trainer t(c, tracker, nullptr, 0.0);
  Reference r;
  for (int s = 0; s < c.run.steps; ++s) r.losses.push_back(t.step(s).loss);
  r.params = t.strategy().full_params();
  r.registry = t.model().registry();
  return r;
}

void check_layout(int dp, int tp, int zero, bool sp) {
  SCOPED_TRACE(fmt::format("dp {} tp {} zero {} sequence_parallel {}", dp, tp, zero, sp));
  const int mb = 2, G = 2 * mb * dp;
  const Reference ref = single_rank(config(1, 1, 0, G, mb));
  comm::CommLog log(prof::now_seconds());
  mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(1, dp, tp), log);
  const auto c = config(dp, tp, zero, G, mb, 10, sp);
  core::MemoryTracker tracker;
  train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
  int clipped = 0;
  for (int s = 0; s < c.run.steps; ++s) {
    estimate_check::begin_step(tracker, &log, s);
    const auto r = t.step(s);
    clipped += r.clipped;
    EXPECT_NEAR(r.loss, ref.losses[s], 1e-5 * std::fabs(ref.losses[s])) << "step " << s;
  }
  EXPECT_GT(clipped, 0);
  estimate_check::expect_estimate_is_measured(c, tracker, t, &log, c.run.steps - 1);
  double key_abs = 0;
  EXPECT_LE(parity::params_error(t.model().registry(), t.strategy().full_params(), ref.registry, ref.params, &key_abs),
            1e-5);
  EXPECT_LE(key_abs, 1e-4);
}

}  // namespace

TEST(TensorParallel, AllRanksInOneGroupMatchOneRank) {
  const int n = parity::world_size();
  for (bool sp : {false, true})
    for (int zero : {0, 1}) check_layout(1, n, zero, sp);
}

TEST(TensorParallel, WithDataParallelAndZeroMatchOneRank) {
  const int n = parity::world_size();
  if (n % 2 != 0 || n < 4) return;  // the same on every rank: no collective is skipped by one alone
  for (int zero : {0, 1, 2, 3}) check_layout(n / 2, 2, zero, zero % 2 == 1);
}

// Per micro-batch on the tp axis: each block all-reduces b*s*h floats twice
// forward (after the row-parallel projections) and twice backward (before
// the column-parallel inputs' norms); outside the blocks, the embedding's
// forward and the head's backward one each, the vocabulary-parallel
// cross-entropy three rows of N (max, sum, target logit), and the step one
// 8-byte squared gradient norm.
TEST(TensorParallel, CommunicationVolumeIsMegatrons) {
  const int n = parity::world_size();
  comm::CommLog log(prof::now_seconds());
  mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(1, 1, n), log);
  const auto c = config(1, n, 0, 2, 2, 1);
  core::MemoryTracker tracker;
  train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
  t.step(0);
  const std::int64_t N = std::int64_t(c.data.micro_batch) * c.model.seq_len, bsh = 4 * N * c.model.d_model;
  int big = 0, rows = 0, scalars = 0;
  std::int64_t total = 0;
  for (const auto& r : log.records()) {
    EXPECT_EQ(std::string(r.axis), "tp");
    EXPECT_EQ(std::string(r.op), "all_reduce");
    total += r.bytes;
    big += r.bytes == bsh;
    rows += r.bytes == 4 * N;
    scalars += r.bytes == 8;
  }
  EXPECT_EQ(big, 4 * c.model.layers + 2);
  EXPECT_EQ(rows, 3);
  EXPECT_EQ(scalars, 1);
  EXPECT_EQ(total, (4 * c.model.layers + 2) * bsh + 3 * 4 * N + 8);
}

// With sequence parallelism the same bytes move as all-gather / reduce-scatter
// pairs: per block two of each forward and two of each backward, of b*s*h
// floats (the whole gathered or scattered buffer); outside the blocks the
// embedding reduce-scatters forward and all-gathers backward, the head
// all-gathers forward and reduce-scatters backward. The norms' outputs are
// kept as this rank's rows, so each is gathered again in the backward pass
// for the weight gradient of the linear that reads it, as Megatron-LM does:
// two more all-gathers per block and one for the final norm. The norm and
// bias gradients of each block (6 h) and of the final norm (2 h) are
// all-reduced.
TEST(TensorParallel, SequenceParallelVolume) {
  const int n = parity::world_size();
  comm::CommLog log(prof::now_seconds());
  mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(1, 1, n), log);
  const auto c = config(1, n, 0, 2, 2, 1, true);
  core::MemoryTracker tracker;
  train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
  t.step(0);
  const std::int64_t N = std::int64_t(c.data.micro_batch) * c.model.seq_len, h = c.model.d_model, bsh = 4 * N * h;
  const int L = c.model.layers;
  int gathers = 0, scatters = 0;
  std::int64_t reduced = 0;
  for (const auto& r : log.records()) {
    EXPECT_EQ(std::string(r.axis), "tp");
    if (std::string(r.op) == "all_gather") gathers += r.bytes == bsh;
    if (std::string(r.op) == "reduce_scatter") scatters += r.bytes == bsh;
    if (std::string(r.op) == "all_reduce") reduced += r.bytes;
  }
  EXPECT_EQ(gathers, 4 * L + 2 + 2 * L + 1);
  EXPECT_EQ(scatters, 4 * L + 2);
  EXPECT_EQ(reduced, 3 * 4 * N + 4 * (6 * h * L + 2 * h) + 8);
}

// Activation recomputation under tensor (with sequence) parallelism and
// pipelines: selective and full give the plain run's losses bit for bit on
// the same layout (the recomputed attention-projection sum is the same
// reduction of the same values); per-op within 1e-6 (its k is a product of
// its own, test_trainer's Trainer.RecomputationIsExact...).
TEST(TensorParallel, RecomputationIsExactOnEveryLayout) {
  const int n = parity::world_size();
  struct L {
    int pp, dp, tp;
    bool sp;
    const char* schedule;
  };
  for (const L l : {L{1, n / 2, 2, true, "1f1b"}, L{2, n / 2, 1, false, "1f1b"}, L{2, n / 4, 2, true, "gpipe"}}) {
    if (l.dp < 1 || l.pp * l.dp * l.tp != n) continue;
    SCOPED_TRACE(fmt::format("pp {} dp {} tp {} sp {} {}", l.pp, l.dp, l.tp, l.sp, l.schedule));
    std::map<std::string, std::vector<double>> loss;
    for (const char* mode : {"none", "selective", "full", "op"}) {
      comm::CommLog log(prof::now_seconds());
      mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(l.pp, l.dp, l.tp), log);
      const std::string text = fmt::format(
          "[run]\nsteps = 4\nwarmup_steps = 0\nseed = 5\n"
          "[model]\nlayers = 4\nd_model = 16\nheads = 4\nvocab = 32\nseq_len = 8\nrecompute = \"{}\"\n"
          "[data]\nglobal_batch = {}\nmicro_batch = 1\n"
          "[parallel]\npp = {}\ndp = {}\ntp = {}\nsequence_parallel = {}\nschedule = \"{}\"\n"
          "[optim]\nlr = 1e-2\n[backend]\nthreads = 1\n",
          mode, 4 * l.dp, l.pp, l.dp, l.tp, l.sp, l.schedule);
      const auto c = deck::parse_deck("test.toml", text, {}).config;
      core::MemoryTracker tracker;
      train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
      for (int s = 0; s < c.run.steps; ++s) {
        estimate_check::begin_step(tracker, &log, s);
        loss[mode].push_back(t.step(s).loss);
      }
      estimate_check::expect_estimate_is_measured(c, tracker, t, &log, c.run.steps - 1);
    }
    EXPECT_EQ(loss["selective"], loss["none"]);
    EXPECT_EQ(loss["full"], loss["none"]);
    for (std::size_t s = 0; s < loss["none"].size(); ++s)
      EXPECT_NEAR(loss["op"][s], loss["none"][s], 1e-6 * loss["none"][s]) << "op, step " << s;
  }
}
