// A mesh axis that no shipped row declares: a test-only row adds a dim
// "rep" (two replicas of the whole run, nesting outside every other dim,
// whose ranks hold the same parameters) and its group. Nothing outside this
// file knows of it, and yet its ranks get a communicator, the comm log
// records calls under its name, the report's /ranks has its column and
// /steps its exposed-communication column, and a checkpoint written on the
// layout with it re-shards onto the registry's own layout.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kernels/foundation/clock.hpp"
#include "kernels/foundation/memory.hpp"
#include "src/deck/deck.hpp"
#include "src/mesh/mesh.hpp"
#include "src/report/h5file.hpp"
#include "src/train/checkpoint.hpp"
#include "src/train/run_report.hpp"
#include "src/train/trainer.hpp"
#include "strategies/registry.hpp"
#include "tests/h5_read.hpp"
#include "tests/mpi/mpi_world.hpp"

using namespace strata;
namespace fs = std::filesystem;

namespace {

// The test's row: the dim "rep" of two replicas and its group, whose
// members train alike (each replica sees the same global batch) and so
// hold the same parameters.
void replica_axes(const plan::Plan&, mesh::Layout& l) {
  mesh::add_dim(l, {.name = "rep", .size = 2, .nest = 50, .doc = "replica of the whole run"});
  mesh::add_group(l, {.name = "rep", .dims = {"rep"}, .same_params = true, .doc = "the replicas"});
}
const strategies::Row kReplicaRow{"rep", "two replicas of the run (a test's axis)", {}, replica_axes};

// The registry's rows and the test's.
mesh::Layout with_replicas(const plan::Plan& p) {
  std::vector<const strategies::Row*> rows = strategies::all_rows();
  rows.push_back(&kReplicaRow);
  return strategies::layout_of(p, rows);
}

deck::Deck make_deck(int dp) {
  const std::string text = fmt::format(
      "[run]\nsteps = 4\nwarmup_steps = 0\nseed = 11\n"
      "[model]\nlayers = 2\nd_model = 16\nheads = 2\nvocab = 32\nseq_len = 8\n"
      "[data]\nglobal_batch = 4\nmicro_batch = 1\n"
      "[parallel]\ndp = {}\nzero = 1\n"
      "[optim]\nlr = 1e-2\n"
      "[backend]\nthreads = 1\n",
      dp);
  return deck::parse_deck("test.toml", text, {});
}

// One directory for the job: rank 0 names it, every rank uses it.
std::string job_dir(const char* what) {
  char buf[256] = {};
  if (mpi_test::world_rank() == 0) {
    const std::string d = (fs::temp_directory_path() / fmt::format("strata-{}-{}", what, ::getpid())).string();
    fs::remove_all(d);
    std::snprintf(buf, sizeof buf, "%s", d.c_str());
  }
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
  return buf;
}

}  // namespace

TEST(MeshAxis, ATestRowsAxisHasItsGroupRanksColumnCommAxisAndCheckpoints) {
  const int n = mpi_test::world_size(), me = mpi_test::world_rank();
  ASSERT_EQ(n % 2, 0) << "two replicas need an even world";
  const deck::Deck a = make_deck(n / 2);
  const mesh::Layout l = with_replicas(a.config);
  ASSERT_EQ(l.world(), n);
  EXPECT_EQ(l.dims.front().name, "rep") << "it nests outside pp";
  EXPECT_EQ(mesh::describe(l), fmt::format("rep 2 x pp 1 x dp {} x tp 1", n / 2));

  comm::CommLog log(prof::now_seconds());
  mesh::Mesh mesh(MPI_COMM_WORLD, l, log);
  // Its group: this rank and the one at the same place in the other replica.
  comm::Communicator& rep = mesh.axis("rep");
  EXPECT_EQ(rep.size(), 2);
  EXPECT_EQ(rep.rank(), me / (n / 2));
  EXPECT_EQ(mesh::group_ranks(l, "rep", me), (std::vector<int>{me % (n / 2), me % (n / 2) + n / 2}));
  std::vector<std::int32_t> members(2, -1);
  const std::int32_t self = me;
  rep.all_gather(&self, members.data(), 1, comm::DType::i32);
  EXPECT_EQ(std::vector<int>(members.begin(), members.end()), mesh::group_ranks(l, "rep", me));
  // The rest of the mesh is the registry's: dp within each replica.
  EXPECT_EQ(mesh.axis("dp").size(), n / 2);
  // Only rank 0 holds a copy of its parameters that no lower rank holds
  // (the replicas, and the data-parallel ranks, hold the same).
  EXPECT_EQ(mesh::first_copy(l, me), me == 0);

  // Training: every replica trains alike; the replicas' losses, summed over
  // the rep group, are twice one's, recorded on the axis "rep".
  const int k = 2;
  std::vector<train::StepRecord> steps;
  const std::string dir = job_dir("axis-ck");
  std::vector<double> losses;
  {
    core::MemoryTracker tracker;
    train::Trainer t(a.config, tracker, nullptr, 0.0, strategies::parallelize(a.config, &mesh));
    for (int s = 0; s < a.config.run.steps; ++s) {
      log.set_step(s);
      const std::size_t first = log.records().size();
      steps.push_back(t.step(s));
      double sum = steps.back().loss;
      rep.all_reduce(&sum, 1, comm::DType::f64, comm::ReduceOp::sum);
      EXPECT_DOUBLE_EQ(sum, 2 * steps.back().loss) << "the replicas agree at step " << s;
      losses.push_back(steps.back().loss);
      // Exposed communication per axis, the test's among them.
      const std::vector<std::string> axes = l.axis_names();
      steps.back().exposed_comm.assign(axes.size(), 0.0);
      for (std::size_t i = first; i < log.records().size(); ++i) {
        const auto at = std::find(axes.begin(), axes.end(), log.records()[i].axis);
        ASSERT_NE(at, axes.end()) << log.records()[i].axis;
        steps.back().exposed_comm[std::size_t(at - axes.begin())] += log.records()[i].wait;
      }
      if (s + 1 == k)
        train::write_checkpoint(MPI_COMM_WORLD, dir, k, train::checkpoint_layout(l, a.config, a.resolved_toml),
                                t.strategy(), t.registry(), mesh::first_copy(l, me));
    }
  }
  std::size_t on_rep = 0;
  for (const comm::CommRecord& r : log.records())
    if (r.axis == "rep") {
      ++on_rep;
      EXPECT_EQ(r.group_size, 2);
    }
  // The membership gather, then one sum a step.
  EXPECT_EQ(on_rep, std::size_t(1 + a.config.run.steps)) << "the comm log names the test's axis";

  // The report: /ranks has a "rep" column, /steps exposed_comm_rep, /comm its calls.
  const std::string report = job_dir("axis-report") + ".h5";
  {
    report::H5File f(MPI_COMM_WORLD, report);
    train::write_tables(f, l, {{me, &steps, nullptr, nullptr, &log, "here"}}, {});
    f.set_attr("/", "status", "complete");
    f.publish();
  }
  if (me == 0) {
    h5_test::ReadFile f(report);
    h5_test::Object ranks(f.id, "/ranks"), st(f.id, "/steps"), cm(f.id, "/comm");
    EXPECT_EQ(h5_test::read_str_attr(ranks.id, "columns"), "rank,host,rep,pp,dp,cp,tp");
    const std::vector<std::int64_t> rank = h5_test::read_i64(ranks.id, "rank"), at = h5_test::read_i64(ranks.id, "rep");
    ASSERT_EQ(rank.size(), std::size_t(n));
    for (std::size_t i = 0; i < rank.size(); ++i) EXPECT_EQ(at[i], rank[i] / (n / 2)) << "rank " << rank[i];
    EXPECT_NE(h5_test::read_str_attr(st.id, "columns").find("exposed_comm_rep"), std::string::npos);
    const std::vector<std::string> axis = h5_test::read_str(cm.id, "axis", 16);
    EXPECT_EQ(std::count(axis.begin(), axis.end(), "rep"), std::ptrdiff_t(n) * (1 + a.config.run.steps));
    fs::remove(report);
  }

  // Resumed on the registry's own layout (dp n, no replicas): the
  // checkpoint's layout had an axis this one lacks, so it re-shards from the
  // global files, and goes on as the run did (the layouts' parity: 1e-5).
  const deck::Deck b = make_deck(n);
  const mesh::Layout plain = strategies::layout_of(b.config);
  comm::CommLog log2(prof::now_seconds());
  mesh::Mesh mesh2(MPI_COMM_WORLD, plain, log2);
  core::MemoryTracker tracker;
  train::Trainer resumed(b.config, tracker, nullptr, 0.0, strategies::parallelize(b.config, &mesh2));
  const train::CheckpointRef ref =
      train::find_checkpoint(MPI_COMM_WORLD, dir, train::checkpoint_layout(plain, b.config, b.resolved_toml));
  EXPECT_TRUE(ref.reshard);
  EXPECT_NE(ref.saved_layout.find("rep 2"), std::string::npos) << ref.saved_layout;
  train::load_checkpoint(MPI_COMM_WORLD, ref, resumed.strategy(), resumed.registry());
  for (int s = k; s < b.config.run.steps; ++s) {
    const double loss = resumed.step(s).loss;
    EXPECT_NEAR(loss, losses[std::size_t(s)], 1e-5 * std::fabs(losses[std::size_t(s)])) << "step " << s;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (me == 0) fs::remove_all(dir);
}
