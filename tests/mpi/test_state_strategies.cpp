// Data parallelism and ZeRO stages 1-3 against the single-rank run, under
// mpiexec with N ranks (all of them in the dp group): the loss trajectory of
// 10 steps (gradient accumulation and clipping active) within 1e-5 relative
// and the final parameters within the same bound; the per-rank memory of
// params, grads and optimizer state equal to the ZeRO paper's figures to the
// byte; and the bytes each step moves equal to the analytical volumes.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <tuple>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>

#include "src/comm/comm_log.hpp"
#include "src/deck/deck.hpp"
#include "src/mesh/mesh.hpp"
#include "kernels/foundation/clock.hpp"
#include "src/train/trainer.hpp"
#include "strategies/zero.hpp"
#include "tests/mpi/estimate_check.hpp"
#include "tests/mpi/parity.hpp"
#include "tests/mpi/mpi_world.hpp"

using namespace strata;
using core::MemCategory;

namespace {

// Tiny, so that 4 ranks on 2 cores stay fast. d_model 16 makes every unit a
// multiple of 4 elements (no shard padding); d_model 6 does not.
plan::Plan config(int dp, int zero, int d_model, int global_batch, int micro_batch, int steps = 10,
                  bool overlap = true) {
  const std::string text = fmt::format(
      "[run]\nsteps = {}\nwarmup_steps = 0\nseed = 21\n"
      "[model]\nlayers = 2\nd_model = {}\nheads = 2\nvocab = 32\nseq_len = 8\n"
      "[data]\nglobal_batch = {}\nmicro_batch = {}\n"
      "[parallel]\ndp = {}\nzero = {}\nbucket_mb = 0.004\noverlap_grad_reduce = {}\n"
      "[optim]\nlr = 1e-2\nweight_decay = 0.1\ngrad_clip = 0.1\nschedule = \"cosine\"\nwarmup = 2\n"
      "[backend]\nthreads = 1\n",
      steps, d_model, global_batch, micro_batch, dp, zero, overlap);
  return deck::parse_deck("test.toml", text, {}).config;
}

struct Trajectory {
  std::vector<double> losses;
  std::vector<float> params;
  models::ParamRegistry registry;
};

Trajectory run_single(const plan::Plan& c) {
  core::MemoryTracker tracker;
  train::Trainer t(c, tracker, nullptr, 0.0);
  Trajectory r;
  for (int s = 0; s < c.run.steps; ++s) r.losses.push_back(t.step(s).loss);
  r.params = t.strategy().full_params();
  r.registry = t.model().registry();
  return r;
}

// Elements per rank of the per-unit shards, and the padding they add.
std::int64_t shard_elems(const models::Model& m, int n) {
  std::int64_t s = 0;
  for (const auto& u : m.units()) s += (u.size() + n - 1) / n;
  return s;
}

}  // namespace

// Every stage, with the gradient reduction overlapping the backward pass
// (parallel.overlap_grad_reduce, the default) and after it.
class Parity : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(Parity, LossAndParametersMatchOneRank) {
  const int n = parity::world_size(), zero = std::get<0>(GetParam());
  const bool overlap = std::get<1>(GetParam());
  for (int d_model : {16, 6}) {
    // Two micro-batches per rank per step: accumulation is exercised.
    const int mb = 2, G = 2 * mb * n;
    const Trajectory ref = run_single(config(1, 0, d_model, G, mb));
    auto distributed = [&](bool overlapped, bool check) {
      comm::CommLog log(prof::now_seconds());
      mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(1, n, 1), log);
      const auto c = config(n, zero, d_model, G, mb, 10, overlapped);
      core::MemoryTracker tracker;
      train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
      Trajectory r;
      int clipped = 0;
      for (int s = 0; s < c.run.steps; ++s) {
        estimate_check::begin_step(tracker, &log, s);
        const auto step = t.step(s);
        clipped += step.clipped;
        r.losses.push_back(step.loss);
      }
      if (check) {
        EXPECT_GT(clipped, 0) << "the test should exercise clipping";
        estimate_check::expect_estimate_is_measured(c, tracker, t, &log, c.run.steps - 1);
      }
      r.params = t.strategy().full_params();
      r.registry = t.model().registry();
      return r;
    };
    const Trajectory got = distributed(overlap, true);
    for (int s = 0; s < int(ref.losses.size()); ++s)
      EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-5 * std::fabs(ref.losses[s]))
          << "zero " << zero << " d_model " << d_model << " step " << s;
    double key_abs = 0;
    EXPECT_LE(parity::params_error(got.registry, got.params, ref.registry, ref.params, &key_abs), 1e-5)
        << "zero " << zero << " d_model " << d_model;
    EXPECT_LE(key_abs, 1e-4) << "zero " << zero << " d_model " << d_model;
    if (!overlap) {
      // The same reductions, only issued later: the overlapped step's
      // trajectory bit for bit.
      const Trajectory overlapped = distributed(true, false);
      EXPECT_EQ(got.losses, overlapped.losses) << "zero " << zero << " d_model " << d_model;
      EXPECT_EQ(got.params, overlapped.params) << "zero " << zero << " d_model " << d_model;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Zero, Parity, ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Bool()));

// 16 Psi (dp), 8 Psi + 8 Psi/N, 4 Psi + 12 Psi/N, 16 Psi/N: held at the end of
// a step, when no gathered unit or unreduced gradient is alive.
TEST(Memory, PerRankBytesAreTheZeroPaperFigures) {
  const int n = parity::world_size();
  for (int d_model : {16, 6}) {
    for (int zero = 0; zero <= 3; ++zero) {
      comm::CommLog log(prof::now_seconds());
      mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(1, n, 1), log);
      const auto c = config(n, zero, d_model, 2 * n, 2, 2);
      core::MemoryTracker tracker;
      train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
      t.step(0);
      const std::uint64_t psi = std::uint64_t(t.model().registry().numel());
      const std::uint64_t S = std::uint64_t(shard_elems(t.model(), n)), psi_p = S * n;
      if (d_model == 16) {
        EXPECT_EQ(psi_p, psi) << "units divisible by N: no padding";
      }
      EXPECT_EQ(std::uint64_t(t.strategy().padding_elements()), zero == 0 ? 0 : psi_p - psi);
      const std::uint64_t params = tracker.current(MemCategory::params), grads = tracker.current(MemCategory::grads),
                          opt = tracker.current(MemCategory::optimizer);
      switch (zero) {
        case 0: EXPECT_EQ(params + grads + opt, 16 * psi); EXPECT_EQ(opt, 8 * psi); break;
        case 1: EXPECT_EQ(params + grads + opt, 8 * psi_p + 8 * psi_p / n); EXPECT_EQ(opt, 8 * S); break;
        case 2: EXPECT_EQ(params + grads + opt, 4 * psi_p + 12 * psi_p / n); EXPECT_EQ(grads, 4 * S); break;
        case 3: EXPECT_EQ(params + grads + opt, 16 * psi_p / n); EXPECT_EQ(params, 4 * S); break;
      }
      EXPECT_EQ(tracker.current(MemCategory::comm), 0u) << "zero " << zero;
      // Stage 3 gathers units while it uses them: the peak shows it.
      if (zero == 3) {
        EXPECT_GT(tracker.peak(MemCategory::params), 4 * S);
      }
    }
  }
}

// Bytes per step on the dp axis (one micro-batch per rank, one step):
// dp all-reduces the gradient buffer; stages 1 and 2 reduce-scatter it and
// all-gather the parameters once; stage 3 reduce-scatters once and gathers
// every unit for its forward and again for its backward, except the final
// norm, whose forward and backward are adjacent, and the position embedding,
// which only the forward pass reads (each gathered once). Scalars:
// the loss (dp: also; zero: and the gradient norm) are 8-byte all-reduces.
// In mixed precision (bf16) every gradient and parameter collective moves
// 2 bytes per element, the scalars stay fp64.
TEST(Volume, BytesPerStepAreTheAnalyticalVolumes) {
  const int n = parity::world_size();
  for (const std::string precision : {"fp32", "bf16"})
  for (int zero = 0; zero <= 3; ++zero) {
    SCOPED_TRACE(precision);
    const std::int64_t e = precision == "fp32" ? 4 : 2;
    comm::CommLog log(prof::now_seconds());
    mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(1, n, 1), log);
    auto c = config(n, zero, 6, 2 * n, 2, 1);
    c.backend.precision = plan::choose<core::Precision>(precision);
    core::MemoryTracker tracker;
    train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
    log.set_step(0);
    const std::size_t before = log.records().size();
    t.step(0);
    std::map<std::string, std::int64_t> bytes;
    for (std::size_t i = before; i < log.records().size(); ++i) {
      const auto& r = log.records()[i];
      EXPECT_EQ(std::string(r.axis), "dp");
      EXPECT_EQ(r.group_size, n);
      bytes[std::string(r.op)] += r.bytes;
    }
    const auto& units = t.model().units();
    const std::int64_t psi = t.model().registry().numel(), S = shard_elems(t.model(), n), psi_p = n * S;
    const std::int64_t lnf_p = n * ((units.back().size() + n - 1) / n), wpe_p = n * ((units[1].size() + n - 1) / n);
    if (zero == 0) {
      EXPECT_EQ(bytes["all_reduce"], e * psi + 8);
      EXPECT_EQ(bytes.count("reduce_scatter") + bytes.count("all_gather"), 0u);
    } else {
      EXPECT_EQ(bytes["all_reduce"], 8 + 8);
      EXPECT_EQ(bytes["reduce_scatter"], e * psi_p);
      EXPECT_EQ(bytes["all_gather"], zero < 3 ? e * psi_p : e * (2 * psi_p - lnf_p - wpe_p));
    }
  }
}

// parallel.grad_sync: ZeRO 2 and 3 reduce each micro-batch's gradients into
// the shard (micro_batch, their default: DeepSpeed's ZeRO-2, FSDP's) or
// accumulate whole gradients over the step and reduce them once (step:
// FSDP's no_sync). Both match one rank, and the dry run's estimate is the
// run; step holds the whole gradients besides the shard (4 Psi_p + 4 S at
// the end of a step, against 4 S) and reduce-scatters them once, m times
// fewer bytes over m micro-batches.
TEST(GradSync, OncePerStepMovesFewerBytesAndHoldsWholeGradients) {
  const int n = parity::world_size(), mb = 2, m = 3, G = m * mb * n;
  const Trajectory ref = run_single(config(1, 0, 16, G, mb, 4));
  for (int zero : {2, 3}) {
    std::map<std::string, std::int64_t> scattered;
    std::map<std::string, std::uint64_t> grads;
    std::int64_t S = 0, psi_p = 0;
    for (const std::string sync : {"micro_batch", "step"}) {
      SCOPED_TRACE(fmt::format("zero {} grad_sync {}", zero, sync));
      comm::CommLog log(prof::now_seconds());
      mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(1, n, 1), log);
      auto c = config(n, zero, 16, G, mb, 4);
      c.parallel.grad_sync = plan::choose<plan::GradSync>(sync);
      core::MemoryTracker tracker;
      train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
      Trajectory r;
      std::size_t before = 0;
      for (int s = 0; s < c.run.steps; ++s) {
        estimate_check::begin_step(tracker, &log, s);
        before = log.records().size();
        r.losses.push_back(t.step(s).loss);
      }
      estimate_check::expect_estimate_is_measured(c, tracker, t, &log, c.run.steps - 1);
      for (std::size_t i = before; i < log.records().size(); ++i)
        if (std::string(log.records()[i].op) == "reduce_scatter") scattered[sync] += log.records()[i].bytes;
      grads[sync] = tracker.current(MemCategory::grads);
      S = shard_elems(t.model(), n), psi_p = n * S;
      for (int s = 0; s < c.run.steps; ++s)
        EXPECT_NEAR(r.losses[s], ref.losses[s], 1e-5 * std::fabs(ref.losses[s])) << "step " << s;
      r.params = t.strategy().full_params();
      r.registry = t.model().registry();
      double key_abs = 0;
      EXPECT_LE(parity::params_error(r.registry, r.params, ref.registry, ref.params, &key_abs), 1e-5);
    }
    EXPECT_EQ(scattered["step"], 4 * psi_p) << "zero " << zero;
    EXPECT_EQ(scattered["micro_batch"], m * 4 * psi_p) << "zero " << zero;
    EXPECT_EQ(grads["micro_batch"], std::uint64_t(4 * S)) << "zero " << zero;
    EXPECT_EQ(grads["step"], std::uint64_t(4 * psi_p + 4 * S)) << "zero " << zero;
  }
}

// Hybrid sharding (parallel.dp_shard = S): ZeRO shards over S consecutive
// dp ranks and replicates across the n / S groups. On 4 ranks S = 2 (two
// groups of two); on 2 ranks S = 1 (every rank holds the whole state, which
// the replica group all-reduces). Each stage: the loss trajectory and the
// final parameters against one rank, the dry run's estimate equal to the
// run; the memory figures of the ZeRO paper with N = S, to the byte; and the
// bytes each step moves: a reduce-scatter and all-gathers of the S-padded
// units over the shard group, and one all-reduce of the rank's shard over
// the replica group.
int hybrid_shard() { return parity::world_size() / 2; }

plan::Plan hybrid(plan::Plan c) {
  c.parallel.dp_shard = hybrid_shard();
  return c;
}

class HybridParity : public ::testing::TestWithParam<int> {};

TEST_P(HybridParity, LossAndParametersMatchOneRank) {
  const int n = parity::world_size(), zero = GetParam(), S = hybrid_shard();
  for (int d_model : {16, 6}) {
    const int mb = 2, G = 2 * mb * n;
    const Trajectory ref = run_single(config(1, 0, d_model, G, mb));
    comm::CommLog log(prof::now_seconds());
    mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(1, n, 1, 1, S), log);
    const auto c = hybrid(config(n, zero, d_model, G, mb));
    core::MemoryTracker tracker;
    train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
    EXPECT_EQ(t.strategy().padding_elements(), S * shard_elems(t.model(), S) - t.model().registry().numel())
        << "units padded to a multiple of the shard group, not of dp";
    for (int s = 0; s < c.run.steps; ++s) {
      estimate_check::begin_step(tracker, &log, s);
      const auto r = t.step(s);
      EXPECT_NEAR(r.loss, ref.losses[s], 1e-5 * std::fabs(ref.losses[s]))
          << "zero " << zero << " d_model " << d_model << " step " << s;
    }
    estimate_check::expect_estimate_is_measured(c, tracker, t, &log, c.run.steps - 1);
    double key_abs = 0;
    EXPECT_LE(parity::params_error(t.model().registry(), t.strategy().full_params(), ref.registry, ref.params,
                                   &key_abs),
              1e-5)
        << "zero " << zero << " d_model " << d_model;
    EXPECT_LE(key_abs, 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(Zero, HybridParity, ::testing::Values(1, 2, 3));

TEST(Hybrid, MemoryIsTheZeroFiguresOverTheShardGroup) {
  const int n = parity::world_size(), S = hybrid_shard();
  for (int zero = 1; zero <= 3; ++zero) {
    comm::CommLog log(prof::now_seconds());
    mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(1, n, 1, 1, S), log);
    const auto c = hybrid(config(n, zero, 6, 2 * n, 2, 2));
    core::MemoryTracker tracker;
    train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
    t.step(0);
    const std::uint64_t sh = std::uint64_t(shard_elems(t.model(), S)), psi_p = sh * S;
    const std::uint64_t params = tracker.current(MemCategory::params), grads = tracker.current(MemCategory::grads),
                        opt = tracker.current(MemCategory::optimizer);
    EXPECT_EQ(opt, 8 * sh) << "zero " << zero;
    switch (zero) {
      case 1: EXPECT_EQ(params + grads + opt, 8 * psi_p + 8 * psi_p / S); break;
      case 2: EXPECT_EQ(params + grads + opt, 4 * psi_p + 12 * psi_p / S); break;
      case 3: EXPECT_EQ(params + grads + opt, 16 * psi_p / S); break;
    }
    EXPECT_EQ(tracker.current(MemCategory::comm), 0u) << "zero " << zero;
  }
}

TEST(Hybrid, BytesPerStepAreTheShardAndReplicaVolumes) {
  const int n = parity::world_size(), S = hybrid_shard();
  for (int zero = 1; zero <= 3; ++zero) {
    comm::CommLog log(prof::now_seconds());
    mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(1, n, 1, 1, S), log);
    const auto c = hybrid(config(n, zero, 6, 2 * n, 2, 1));
    core::MemoryTracker tracker;
    train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
    log.set_step(0);
    const std::size_t before = log.records().size();
    t.step(0);
    std::map<std::string, std::int64_t> bytes;
    for (std::size_t i = before; i < log.records().size(); ++i) {
      const auto& r = log.records()[i];
      const std::string axis(r.axis);
      EXPECT_EQ(r.group_size, axis == "dp" ? n : axis == "dp_shard" ? S : n / S) << axis << " " << r.op;
      bytes[axis + " " + std::string(r.op)] += r.bytes;
    }
    const auto& units = t.model().units();
    const std::int64_t sh = shard_elems(t.model(), S), psi_p = S * sh;
    const std::int64_t lnf_p = S * ((units.back().size() + S - 1) / S), wpe_p = S * ((units[1].size() + S - 1) / S);
    EXPECT_EQ(bytes["dp all_reduce"], 8) << "the loss";
    EXPECT_EQ(bytes["dp_shard all_reduce"], S > 1 ? 8 : 0) << "the gradient norm (its shard's part)";
    EXPECT_EQ(bytes["dp_replica all_reduce"], 4 * sh) << "zero " << zero;
    // A shard group of one moves nothing over itself.
    EXPECT_EQ(bytes["dp_shard reduce_scatter"], S > 1 ? 4 * psi_p : 0) << "zero " << zero;
    EXPECT_EQ(bytes["dp_shard all_gather"], S == 1 ? 0 : zero < 3 ? 4 * psi_p : 4 * (2 * psi_p - lnf_p - wpe_p))
        << "zero " << zero;
  }
}

// Bucketing: with a bucket smaller than the gradient buffer, the DP
// all-reduces are several and non-blocking, launched during the backward pass.
TEST(Buckets, DataParallelLaunchesBucketsDuringBackward) {
  const int n = parity::world_size();
  comm::CommLog log(prof::now_seconds());
  mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(1, n, 1), log);
  const auto c = config(n, 0, 16, 2 * n, 2, 1);
  core::MemoryTracker tracker;
  train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
  t.step(0);
  int nonblocking = 0;
  for (const auto& r : log.records())
    if (std::string(r.op) == "all_reduce" && r.nonblocking) ++nonblocking;
  const std::int64_t psi = t.model().registry().numel();
  const std::int64_t per = std::int64_t(0.004 * (1 << 20)) / 4;
  EXPECT_EQ(nonblocking, int((psi + per - 1) / per));
}

// Optimizer offload to the host: AdamW's moments live in the host arena
// (the device holds none), the update runs there on copies of the rank's
// gradients and parameters, and the trajectory is the on-device one bit for
// bit, under dp and every ZeRO stage. Per step the host receives 8 bytes
// and returns 4 per element the rank updates; the arena holds 8 (moments)
// + 4 + 4 (staging) per element of its shards, padding included (so every
// rank holds the same bytes). In mixed precision (bf16, ZeRO-Offload's
// split) the fp32 master weights live there too (12 bytes with the
// moments): the host receives the 16-bit gradients and returns the 16-bit
// parameters (2 bytes each way), through 2 + 2 bytes of staging.
// NVMe offload moves the same bytes between device and host, but the state
// lives in the rank's file and streams through two chunk buffers of the
// host arena: with 1024-element chunks (offload.chunk_mb = 1/256) every
// optimizer range of k elements reads and writes ceil(k / 1024) whole
// chunks of m, v (and master weights) per step, many chunks per range here,
// so the double buffering and the padding of the last chunk are exercised.
TEST(StateStrategies, OffloadIsExactAndMovesTheOptimizerState) {
  const int n = parity::world_size();
  comm::CommLog log(prof::now_seconds());
  mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(1, n, 1), log);
  const std::string dir = (std::filesystem::temp_directory_path() / fmt::format("strata-nvme-{}", ::getpid())).string();
  for (const std::string precision : {"fp32", "bf16"})
  for (int zero : {0, 1, 2, 3}) {
    SCOPED_TRACE(fmt::format("zero {} {}", zero, precision));
    const bool mixed = precision != "fp32";
    const double to_host = mixed ? 2 : 8, to_device = mixed ? 2 : 4, staging = mixed ? 2 : 4;
    const std::int64_t chunk_bytes = 1024 * (mixed ? 3 : 2) * 4;
    std::map<std::string, std::vector<double>> loss;
    std::map<std::string, std::vector<float>> params;
    std::size_t device_optimizer = 0;
    for (const std::string offload : {"none", "host", "nvme"}) {
      SCOPED_TRACE(offload);
      auto c = config(n, zero, 16, 2 * n, 1, 4);
      c.parallel.offload = plan::choose<plan::Offload>(offload);
      c.offload.path = dir;
      c.offload.chunk_mb = 1.0 / 256;
      c.backend.precision = plan::choose<core::Precision>(precision);
      core::MemoryTracker tracker;
      train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
      // Elements this rank updates, per optimizer: its shard of every unit
      // (dp: one optimizer for all).
      std::int64_t own = 0, padded = 0, nvme_bytes = 0;
      for (const auto& u : t.units()) {
        const std::int64_t shard = zero == 0 ? u.size() : (u.size() + n - 1) / n;
        const int r = mesh.axis("dp").rank();
        const std::int64_t k = zero == 0 ? u.size() : std::max<std::int64_t>(0, std::min(u.size() - r * shard, shard));
        own += k;
        padded += shard;
        if (zero > 0) nvme_bytes += (k + 1023) / 1024 * chunk_bytes;
      }
      if (zero == 0) nvme_bytes = (own + 1023) / 1024 * chunk_bytes;
      const bool off = offload != "none";
      for (int s = 0; s < c.run.steps; ++s) {
        estimate_check::begin_step(tracker, nullptr, s);
        const auto r = t.step(s);
        loss[offload].push_back(r.loss);
        EXPECT_EQ(r.offload.bytes_to_host, off ? to_host * double(own) : 0.0);
        EXPECT_EQ(r.offload.bytes_to_device, off ? to_device * double(own) : 0.0);
        EXPECT_EQ(r.offload.nvme_bytes_read, offload == "nvme" ? double(nvme_bytes) : 0.0);
        EXPECT_EQ(r.offload.nvme_bytes_written, offload == "nvme" ? double(nvme_bytes) : 0.0);
      }
      estimate_check::expect_estimate_is_measured(c, tracker, t);
      params[offload] = t.strategy().full_params();
      if (!off) device_optimizer = tracker.current(MemCategory::optimizer);
      if (off) {
        EXPECT_EQ(tracker.current(MemCategory::optimizer), 0u) << "no optimizer state left on the device";
        EXPECT_EQ(t.host_tracker().current(MemCategory::optimizer),
                  offload == "host" ? device_optimizer : std::size_t(2 * (chunk_bytes + 4096)))
            << "nvme: the two chunk buffers (each allocated 4 KiB over, for alignment)";
        EXPECT_EQ(t.host_tracker().current(MemCategory::params), std::size_t(staging) * std::size_t(padded));
        EXPECT_EQ(t.host_tracker().current(MemCategory::grads), std::size_t(staging) * std::size_t(padded));
      }
      if (offload == "nvme") {
        ASSERT_NE(t.nvme_file(), nullptr);
        EXPECT_TRUE(std::filesystem::exists(t.nvme_file()->path()));
        EXPECT_TRUE(t.nvme_file()->mode() == "O_DIRECT" || t.nvme_file()->mode().starts_with("buffered ("))
            << t.nvme_file()->mode();
      }
    }
    EXPECT_EQ(loss["host"], loss["none"]) << "bit for bit";
    EXPECT_EQ(params["host"], params["none"]);
    EXPECT_EQ(loss["nvme"], loss["none"]) << "bit for bit";
    EXPECT_EQ(params["nvme"], params["none"]);
  }
  // Every rank's file is removed with its trainer.
  EXPECT_TRUE(!std::filesystem::exists(dir) || std::filesystem::is_empty(dir));
  MPI_Barrier(MPI_COMM_WORLD);
  std::error_code ec;
  if (mpi_test::world_rank() == 0) std::filesystem::remove_all(dir, ec);
}

// ZeRO-3 with its parameter shard on NVMe too (offload.params): the device
// holds no parameter bytes between steps (only gathered units while in
// use), the trajectory is on-device ZeRO-3's bit for bit, and every step
// writes back exactly each owned block's 4 KiB-aligned region (after its
// update) beside the optimizer chunks, and reads those and more (every
// gather reads the rank's block first).
TEST(StateStrategies, ParameterOffloadToNvmeIsExact) {
  const int n = parity::world_size();
  comm::CommLog log(prof::now_seconds());
  mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(1, n, 1), log);
  const std::string dir = (std::filesystem::temp_directory_path() / fmt::format("strata-nvmep-{}", ::getpid())).string();
  for (const std::string precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    const std::int64_t e = precision == "fp32" ? 4 : 2, chunk_bytes = 1024 * (precision == "fp32" ? 2 : 3) * 4;
    std::map<bool, std::vector<double>> loss;
    std::map<bool, std::vector<float>> params;
    for (bool offload : {false, true}) {
      auto c = config(n, 3, 16, 2 * n, 1, 4);
      c.backend.precision = plan::choose<core::Precision>(precision);
      if (offload) {
        c.parallel.offload = plan::Offload::nvme;
        c.offload.path = dir;
        c.offload.chunk_mb = 1.0 / 256;
        c.offload.params = true;
      }
      core::MemoryTracker tracker;
      train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
      std::int64_t written = 0;
      for (const auto& u : t.units()) {
        const std::int64_t shard = (u.size() + n - 1) / n;
        const std::int64_t k = std::max<std::int64_t>(0, std::min(u.size() - mesh.axis("dp").rank() * shard, shard));
        if (k > 0) written += (shard * e + 4095) / 4096 * 4096 + (k + 1023) / 1024 * chunk_bytes;
      }
      for (int s = 0; s < c.run.steps; ++s) {
        estimate_check::begin_step(tracker, nullptr, s);
        const auto r = t.step(s);
        loss[offload].push_back(r.loss);
        if (offload) {
          EXPECT_EQ(r.offload.nvme_bytes_written, double(written));
          EXPECT_GT(r.offload.nvme_bytes_read, double(written));
          EXPECT_EQ(tracker.current(MemCategory::params), 0u) << "no parameter bytes held between steps";
          EXPECT_GT(tracker.peak(MemCategory::params), 0u) << "gathered units while in use";
        }
      }
      estimate_check::expect_estimate_is_measured(c, tracker, t);
      params[offload] = t.strategy().full_params();
    }
    EXPECT_EQ(loss[true], loss[false]) << "bit for bit";
    EXPECT_EQ(params[true], params[false]);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  std::error_code ec;
  if (mpi_test::world_rank() == 0) std::filesystem::remove_all(dir, ec);
}
