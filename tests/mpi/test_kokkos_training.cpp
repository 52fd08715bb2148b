// Training on the Kokkos backend against the CPU backend, under mpiexec with
// N ranks (1 and 2), all in the dp group: the same deck trained in one
// process on both devices (bytes of a text, so that the loss falls), under
// data parallelism and ZeRO 1-3, with gradient accumulation and clipping
// active. Over 10 steps the losses stay
// within 1e-5 relative of the CPU backend's and the final parameters within
// 1e-5 (norm-wise per tensor, tests/mpi/parity.hpp); the bytes each rank
// holds for parameters, gradients and optimizer state are equal.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kernels/foundation/clock.hpp"
#include "kernels/kernels.hpp"
#include "src/comm/comm_log.hpp"
#include "src/deck/deck.hpp"
#include "src/mesh/mesh.hpp"
#include "src/train/trainer.hpp"
#include "tests/mpi/parity.hpp"
#include "tests/mpi/mpi_world.hpp"

using namespace strata;
using core::MemCategory;

namespace {

plan::Plan config(const char* device, int dp, int zero) {
  const std::string text = fmt::format(
      "[run]\nsteps = 10\nwarmup_steps = 0\nseed = 13\n"
      "[model]\nlayers = 2\nd_model = 32\nheads = 4\nvocab = 256\nseq_len = 32\n"
      "[data]\nsource = \"text\"\npath = \"/usr/share/common-licenses/GPL-3\"\nglobal_batch = {}\nmicro_batch = 2\n"
      "[parallel]\ndp = {}\nzero = {}\nbucket_mb = 0.004\n"
      "[optim]\nlr = 3e-3\nweight_decay = 0.1\ngrad_clip = 0.1\nschedule = \"cosine\"\nwarmup = 2\n"
      "[backend]\nthreads = 1\ndevice = \"{}\"\n",
      4 * dp, dp, zero, device);
  return deck::parse_deck("kokkos.toml", text, {}).config;
}

struct Trajectory {
  std::vector<double> losses;
  std::vector<float> params;
  models::ParamRegistry registry;
  std::size_t held[3] = {0, 0, 0};  // params, grads, optimizer
  int clipped = 0;
};

Trajectory train_on(kernels::Device d, int zero) {
  const int n = parity::world_size();
  kernels::use_device(d);
  const plan::Plan c = config(kernels::device_name(d), n, zero);
  Trajectory r;
  {
    comm::CommLog log(prof::now_seconds());
    mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(1, n, 1), log);
    core::MemoryTracker tracker;
    train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
    for (int s = 0; s < c.run.steps; ++s) {
      const train::StepRecord step = t.step(s);
      r.losses.push_back(step.loss);
      r.clipped += step.clipped;
    }
    r.params = t.strategy().full_params();
    r.registry = t.model().registry();
    r.held[0] = tracker.current(MemCategory::params);
    r.held[1] = tracker.current(MemCategory::grads);
    r.held[2] = tracker.current(MemCategory::optimizer);
  }
  kernels::use_device(kernels::Device::cpu);
  return r;
}

}  // namespace

class KokkosTraining : public ::testing::TestWithParam<int> {};

TEST_P(KokkosTraining, MatchesTheCpuBackend) {
  const int zero = GetParam();
  const Trajectory cpu = train_on(kernels::Device::cpu, zero);
  const Trajectory kok = train_on(kernels::Device::kokkos, zero);
  ASSERT_EQ(kok.losses.size(), cpu.losses.size());
  for (std::size_t s = 0; s < cpu.losses.size(); ++s)
    EXPECT_NEAR(kok.losses[s], cpu.losses[s], 1e-5 * std::fabs(cpu.losses[s])) << "zero " << zero << " step " << s;
  EXPECT_LT(cpu.losses.back(), cpu.losses.front() - 0.1) << "it trains: the comparison is not of two flat lines";
  EXPECT_GT(cpu.clipped, 0) << "the test should exercise clipping";
  double key_abs = 0;
  std::string worst;
  EXPECT_LE(parity::params_error(kok.registry, kok.params, cpu.registry, cpu.params, &key_abs, &worst), 1e-5)
      << "zero " << zero << ", worst tensor " << worst;
  EXPECT_LE(key_abs, 1e-4) << "zero " << zero;
  for (int k = 0; k < 3; ++k) EXPECT_EQ(kok.held[k], cpu.held[k]) << "zero " << zero << " category " << k;
}

INSTANTIATE_TEST_SUITE_P(Zero, KokkosTraining, ::testing::Values(0, 1, 2, 3));
