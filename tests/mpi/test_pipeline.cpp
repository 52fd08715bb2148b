// Pipeline parallelism against the single-rank run, under mpiexec: the model
// cut into pp balanced stages running the GPipe or 1F1B schedule, alone and
// composed with data and tensor (and sequence) parallelism. The loss
// trajectory of 10 steps within 1e-5 relative, every stage's parameters
// (the last stage's copy of the tied embedding too) equal to their slice of
// the single-rank run's; and 1F1B holding fewer micro-batches' activations
// than GPipe.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

#include <fmt/format.h>

#include "src/comm/comm_log.hpp"
#include "src/deck/deck.hpp"
#include "src/mesh/mesh.hpp"
#include "src/prof/clock.hpp"
#include "src/train/trainer.hpp"
#include "tests/mpi/parity.hpp"

using namespace strata;

namespace {

struct Layout {
  int pp, dp, tp;
  bool sp;
  const char* schedule;
};

deck::Config config(const Layout& l, int global_batch, int micro_batch, int steps = 10) {
  const std::string text = fmt::format(
      "[run]\nsteps = {}\nwarmup_steps = 0\nseed = 13\n"
      "[model]\nlayers = 4\nd_model = 16\nheads = 4\nvocab = 32\nseq_len = 8\n"
      "[data]\nglobal_batch = {}\nmicro_batch = {}\n"
      "[parallel]\npp = {}\ndp = {}\ntp = {}\nsequence_parallel = {}\nschedule = \"{}\"\n"
      "[optim]\nlr = 1e-2\nweight_decay = 0.1\ngrad_clip = 0.1\n"
      "[backend]\nthreads = 1\n",
      steps, global_batch, micro_batch, l.pp, l.dp, l.tp, l.sp, l.schedule);
  return deck::parse_deck("test.toml", text, {}).config;
}

void check(const Layout& l) {
  SCOPED_TRACE(fmt::format("pp {} dp {} tp {} sp {} {}", l.pp, l.dp, l.tp, l.sp, l.schedule));
  const int mb = 1, G = 4 * mb * l.dp;  // 4 micro-batches per step on every pipeline
  core::MemoryTracker rt;
  const auto rc = config({1, 1, 1, false, "1f1b"}, G, mb);
  train::Trainer ref(rc, rt, nullptr, 0.0);
  std::vector<double> losses;
  for (int s = 0; s < rc.run.steps; ++s) losses.push_back(ref.step(s).loss);

  comm::CommLog log(prof::now_seconds());
  mesh::Mesh mesh(MPI_COMM_WORLD, mesh::Layout{l.pp, l.dp, l.tp}, log);
  const auto c = config(l, G, mb);
  core::MemoryTracker tracker;
  train::Trainer t(c, tracker, nullptr, 0.0, &mesh.dp(), &mesh.tp(), &mesh.pp(), mesh.embedding());
  int clipped = 0;
  for (int s = 0; s < c.run.steps; ++s) {
    const auto r = t.step(s);
    clipped += r.clipped;
    EXPECT_NEAR(r.loss, losses[s], 1e-5 * std::fabs(losses[s])) << "step " << s;
  }
  EXPECT_GT(clipped, 0);
  double key_abs = 0;
  EXPECT_LE(parity::params_error(t.model().registry(), t.strategy().full_params(), ref.model().registry(),
                                 ref.strategy().full_params(), &key_abs),
            1e-5);
  EXPECT_LE(key_abs, 1e-4);
}

}  // namespace

TEST(Pipeline, AllRanksAsStagesMatchOneRank) {
  const int n = parity::world_size();
  for (const char* schedule : {"gpipe", "1f1b"}) check({n, 1, 1, false, schedule});
}

TEST(Pipeline, ComposedWithDataAndTensorParallelismMatchOneRank) {
  const int n = parity::world_size();
  if (n != 4) return;  // the same on every rank
  check({2, 2, 1, false, "1f1b"});
  check({2, 1, 2, true, "gpipe"});
}

// GPipe keeps every micro-batch's activations until the backward passes;
// 1F1B keeps at most p - rank (one more while a send completes).
TEST(Pipeline, OneFOneBHoldsFewerActivationsThanGPipe) {
  const int n = parity::world_size();
  std::uint64_t peak[2] = {0, 0};
  std::size_t slots[2] = {0, 0};
  int k = 0;
  for (const char* schedule : {"gpipe", "1f1b"}) {
    comm::CommLog log(prof::now_seconds());
    mesh::Mesh mesh(MPI_COMM_WORLD, mesh::Layout{n, 1, 1}, log);
    const int m = 2 * n + 2;
    const auto c = config({n, 1, 1, false, schedule}, m, 1, 2);
    core::MemoryTracker tracker;
    train::Trainer t(c, tracker, nullptr, 0.0, &mesh.dp(), &mesh.tp(), &mesh.pp(), mesh.embedding());
    t.step(0);
    t.step(1);
    peak[k] = tracker.peak(core::MemCategory::activations);
    slots[k] = t.pipeline_slots();
    if (k == 0) {
      EXPECT_EQ(slots[k], std::size_t(m)) << "GPipe holds every micro-batch";
    }
    ++k;
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  EXPECT_LE(slots[1], std::size_t(n - rank + 1)) << "1F1B on rank " << rank;
  EXPECT_LT(peak[1], peak[0]);
}
