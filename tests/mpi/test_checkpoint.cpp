// Checkpoint and resume under mpiexec: a run stopped after step k, written
// to a sharded checkpoint and continued by a fresh trainer from it, equals
// the uninterrupted run bit for bit (every later loss, the final
// parameters), for data parallelism, every ZeRO stage, a pipeline, tensor
// parallelism and expert parallelism; continued on another layout it is
// re-sharded and matches within the layouts' parity; and a checkpoint only
// counts once published.
#include <gtest/gtest.h>
#include <mpi.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "src/comm/comm_log.hpp"
#include "kernels/foundation/error.hpp"
#include "src/deck/deck.hpp"
#include "src/mesh/mesh.hpp"
#include "kernels/foundation/clock.hpp"
#include "src/train/checkpoint.hpp"
#include "src/train/trainer.hpp"
#include "tests/mpi/parity.hpp"
#include "tests/mpi/mpi_world.hpp"

using namespace strata;
namespace fs = std::filesystem;

namespace {

struct Layout {
  int pp = 1, dp = 1, tp = 1, ep = 1, zero = 0;
  bool moe = false;
  std::string precision = "fp32";
  std::string offload = "none";
  int dp_shard = 0;  // hybrid sharding's shard group (0: dp)
};

// The same global batch (8 sequences) on every layout, so that any two
// layouts train the same model on the same data.
deck::Deck make_deck(const Layout& l) {
  const std::string text = fmt::format(
      "[run]\nsteps = 6\nwarmup_steps = 0\nseed = 7\n"
      "[model]\nkind = \"{}\"\nmoe_experts = {}\nlayers = 2\nd_model = 16\nheads = 4\nvocab = 32\nseq_len = 8\n"
      "[data]\nglobal_batch = {}\nmicro_batch = 1\n"
      "[parallel]\npp = {}\ndp = {}\ntp = {}\nep = {}\nzero = {}\noffload = \"{}\"\ndp_shard = {}\n"
      "[offload]\npath = \"{}\"\nchunk_mb = 0.00390625\nparams = {}\n"
      "[optim]\nlr = 1e-2\nschedule = \"cosine\"\nwarmup = 2\nweight_decay = 0.1\ngrad_clip = 0.5\n"
      "[backend]\nthreads = 1\nprecision = \"{}\"\nloss_scale = {}\nloss_scale_window = 2\n",
      l.moe ? "moe" : "gpt", l.moe ? 4 : 0, 8, l.pp, l.dp, l.tp, l.ep, l.zero, l.offload, l.dp_shard,
      (fs::temp_directory_path() / "strata-ck-nvme").string(), l.offload == "nvme" && l.zero == 3, l.precision,
      // fp16: a scale that overflows for the first steps, so that the
      // checkpoint carries skipped steps and a scale in motion.
      l.precision == "fp16" ? "262144.0" : "65536.0");
  return deck::parse_deck("test.toml", text, {});
}

train::CheckpointLayout layout_of(const Layout&, const deck::Deck& d) {
  return train::checkpoint_layout(strategies::layout_of(d.config), d.config, d.resolved_toml);
}

std::string temp_dir() {
  // One directory for the job: rank 0 names it, every rank uses it.
  char buf[256] = {};
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    const std::string d = (fs::temp_directory_path() / fmt::format("strata-ck-{}", ::getpid())).string();
    fs::remove_all(d);
    std::snprintf(buf, sizeof buf, "%s", d.c_str());
  }
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
  return buf;
}

void check(const Layout& l) {
  SCOPED_TRACE(fmt::format("pp {} dp {} tp {} ep {} zero {} moe {} {} offload {} dp_shard {}", l.pp, l.dp, l.tp, l.ep,
                           l.zero, l.moe, l.precision, l.offload, l.dp_shard));
  const deck::Deck d = make_deck(l);
  const auto& c = d.config;
  comm::CommLog log(prof::now_seconds());
  mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(l.pp, l.dp, l.tp, l.ep, l.dp_shard), log);
  auto trainer = [&](core::MemoryTracker& t) {
    return std::make_unique<train::Trainer>(c, t, nullptr, 0.0, strategies::parallelize(c, &mesh));
  };
  core::MemoryTracker t0, t1, t2;
  auto whole = trainer(t0);
  std::vector<double> losses;
  int skipped = 0;
  for (int s = 0; s < c.run.steps; ++s) {
    const auto r = whole->step(s);
    losses.push_back(r.loss);
    skipped += r.skipped;
  }
  if (l.precision == "fp16") {
    EXPECT_GT(skipped, 0) << "the fp16 case should carry skipped steps over the checkpoint";
  }

  const std::string dir = temp_dir();
  const int k = 3;
  {
    auto first = trainer(t1);
    for (int s = 0; s < k; ++s) EXPECT_EQ(first->step(s).loss, losses[s]);
    train::write_checkpoint(MPI_COMM_WORLD, dir, k, layout_of(l, d), first->strategy(), first->registry(),
                            mesh::first_copy(mesh.layout(), mesh.rank()), first->scaler());
  }
  auto resumed = trainer(t2);
  const train::CheckpointRef ref = train::find_checkpoint(MPI_COMM_WORLD, dir, layout_of(l, d));
  EXPECT_EQ(ref.step, k);
  EXPECT_EQ(fs::path(ref.dir).filename(), "step-000003");
  EXPECT_FALSE(ref.reshard);
  train::load_checkpoint(MPI_COMM_WORLD, ref, resumed->strategy(), resumed->registry());
  resumed->set_scaler(ref.scaler);  // as run_deck does
  for (int s = k; s < c.run.steps; ++s) EXPECT_EQ(resumed->step(s).loss, losses[s]) << "step " << s << " bit for bit";
  EXPECT_EQ(resumed->strategy().full_params(), whole->strategy().full_params());

  MPI_Barrier(MPI_COMM_WORLD);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) fs::remove_all(dir);
}

}  // namespace

TEST(Checkpoint, ResumeIsBitExactOnEveryStrategy) {
  const int n = parity::world_size();
  for (int zero : {0, 1, 2, 3}) check({1, n, 1, 1, zero});
  // Mixed precision: the 16-bit parameters, the master weights and fp16's
  // loss scaler (scale, good steps, skipped steps) all carry over.
  for (const char* precision : {"bf16", "fp16"}) {
    check({1, n, 1, 1, 0, false, precision});
    check({1, n, 1, 1, 3, false, precision});
  }
  // NVMe offload: the state read from the rank's file for the checkpoint,
  // and written into the resumed run's file.
  check({1, n, 1, 1, 2, false, "fp32", "nvme"});
  check({1, n, 1, 1, 0, false, "bf16", "nvme"});
  // Hybrid sharding: replicas of a shard write the same state.
  check({1, n, 1, 1, 3, false, "fp32", "none", n / 2});
  check({1, n, 1, 1, 3, false, "bf16", "nvme"});  // the parameter shard on NVMe too
  if (n == 2) {
    check({2, 1, 1});
    check({1, 1, 2});
  }
  if (n == 4) {
    check({2, 2, 1, 1, 1});
    check({1, 4, 1, 2, 2, true});
    check({1, 2, 2, 2, 0, true});
  }
}

// Re-sharding: a checkpoint written on one layout continues on another (its
// parameters and moments rebuilt by name and global index from the global
// files), matching the uninterrupted run on the first layout as the
// layouts' parity does (1e-5 relative per loss).
void check_reshard(const Layout& from, const Layout& to) {
  SCOPED_TRACE(fmt::format("from pp {} dp {} tp {} ep {} zero {} dp_shard {} to pp {} dp {} tp {} ep {} zero {} "
                           "dp_shard {}",
                           from.pp, from.dp, from.tp, from.ep, from.zero, from.dp_shard, to.pp, to.dp, to.tp, to.ep,
                           to.zero, to.dp_shard));
  const deck::Deck a = make_deck(from), b = make_deck(to);
  const std::string dir = temp_dir();
  const int k = 2;
  std::vector<double> losses;
  {
    comm::CommLog log(prof::now_seconds());
    mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(from.pp, from.dp, from.tp, from.ep, from.dp_shard), log);
    core::MemoryTracker t0, t1;
    train::Trainer whole(a.config, t0, nullptr, 0.0, strategies::parallelize(a.config, &mesh));
    for (int s = 0; s < a.config.run.steps; ++s) losses.push_back(whole.step(s).loss);
    train::Trainer first(a.config, t1, nullptr, 0.0, strategies::parallelize(a.config, &mesh));
    for (int s = 0; s < k; ++s) first.step(s);
    train::write_checkpoint(MPI_COMM_WORLD, dir, k, layout_of(from, a), first.strategy(), first.registry(),
                            mesh::first_copy(mesh.layout(), mesh.rank()));
  }
  comm::CommLog log(prof::now_seconds());
  mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(to.pp, to.dp, to.tp, to.ep, to.dp_shard), log);
  core::MemoryTracker t2;
  train::Trainer resumed(b.config, t2, nullptr, 0.0, strategies::parallelize(b.config, &mesh));
  const auto ref = train::find_checkpoint(MPI_COMM_WORLD, dir, layout_of(to, b));
  EXPECT_TRUE(ref.reshard);
  train::load_checkpoint(MPI_COMM_WORLD, ref, resumed.strategy(), resumed.registry());
  for (int s = k; s < b.config.run.steps; ++s) {
    const double loss = resumed.step(s).loss;
    EXPECT_NEAR(loss, losses[s], 1e-5 * std::fabs(losses[s])) << "step " << s;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) fs::remove_all(dir);
}

TEST(Checkpoint, ResumeOnAnotherLayoutReshards) {
  const int n = parity::world_size();
  if (n == 2) {
    check_reshard({1, 2, 1, 1, 0}, {1, 2, 1, 1, 3});  // ZeRO 0 -> 3
    check_reshard({2, 1, 1, 1, 0}, {1, 1, 2, 1, 0});  // pp 2 -> tp 2
    check_reshard({1, 1, 2, 1, 0}, {1, 2, 1, 1, 1});  // tp 2 -> dp 2, ZeRO 1
    check_reshard({1, 2, 1, 2, 1, true}, {1, 2, 1, 1, 2, true});  // ep 2 -> ep 1
    check_reshard({1, 2, 1, 1, 2, false, "fp32", "none", 1}, {1, 2, 1, 1, 2});  // replicated shards -> ZeRO-2
  }
  if (n == 4) {
    check_reshard({2, 2, 1, 1, 1}, {1, 4, 1, 1, 2});  // pp 2 x dp 2 -> dp 4
    check_reshard({1, 4, 1, 2, 3, true}, {1, 2, 2, 2, 0, true});  // ep 2 of dp 4 -> ep 2 of dp 2 x tp 2
    check_reshard({1, 4, 1, 1, 3, false, "fp32", "none", 2}, {1, 4, 1, 1, 3});  // ZeRO-3 over 2 -> over 4
  }
}

// Only a published checkpoint (renamed into place with its manifest) is
// found: a partial directory of a later step, as a job killed while writing
// leaves, is passed over for the last complete one; and a rank file that
// does not match its manifest's tensors is an error on every rank.
TEST(Checkpoint, PartialAndCorruptCheckpointsAreNotLoaded) {
  const int n = parity::world_size();
  const Layout l{1, n};
  const deck::Deck d = make_deck(l);
  comm::CommLog log(prof::now_seconds());
  mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(1, n, 1), log);
  core::MemoryTracker tracker;
  train::Trainer t(d.config, tracker, nullptr, 0.0, strategies::parallelize(d.config, &mesh));
  t.step(0);
  const std::string dir = temp_dir();
  train::write_checkpoint(MPI_COMM_WORLD, dir, 1, layout_of(l, d), t.strategy(), t.registry(),
                          mesh::first_copy(mesh.layout(), mesh.rank()));
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    // What a kill between the rank files and the manifest leaves.
    fs::create_directories(fs::path(dir) / ".step-000002.partial");
    fs::copy(fs::path(dir) / "step-000001" / "rank-00000.bin", fs::path(dir) / ".step-000002.partial");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const auto ref = train::find_checkpoint(MPI_COMM_WORLD, dir, layout_of(l, d));
  EXPECT_EQ(ref.step, 1);
  train::load_checkpoint(MPI_COMM_WORLD, ref, t.strategy(), t.registry());
  // One byte flipped in the last rank's file: the checksum catches it.
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == n - 1) {
    const fs::path f = fs::path(ref.dir) / fmt::format("rank-{:05d}.bin", n - 1);
    std::FILE* fp = std::fopen(f.c_str(), "r+b");
    ASSERT_NE(fp, nullptr);
    std::fseek(fp, -20, SEEK_END);
    const int c = std::fgetc(fp);
    std::fseek(fp, -20, SEEK_END);
    std::fputc(c ^ 0x5a, fp);
    std::fclose(fp);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  try {
    train::load_checkpoint(MPI_COMM_WORLD, ref, t.strategy(), t.registry());
    ADD_FAILURE() << "a corrupt rank file was loaded";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) fs::remove_all(dir);
}
