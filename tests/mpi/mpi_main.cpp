// A GoogleTest main for tests that run under MPI (mpiexec -n N, or a single
// process as an MPI singleton): MPI is initialised around RUN_ALL_TESTS, rank 0
// prints the usual report, and every rank exits with the verdict of all ranks.
//
// Rules for test bodies, because every rank runs every test in the same order:
// * No ASSERT_*, GTEST_SKIP or early return on some ranks only before a
//   collective (MPI or parallel HDF5): the other ranks would wait in it
//   forever. Use EXPECT_*, or reduce a condition across ranks first and
//   then branch on the reduced value on every rank.
// * No shuffling, no test filters that differ by rank, no death tests, and
//   never exit(): a fatal error calls MPI_Abort.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

namespace {

// Ranks other than 0 print nothing for passing tests, but a failure on any
// rank must be visible, so they print failed assertions with their rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.message());
    std::fflush(stderr);
  }

 private:
  int rank_;
};

// Runs on every rank: after each test, rank 0 learns which ranks failed it,
// so its report names a test that passed on rank 0 but failed elsewhere.
// (A collective per test: all ranks run the same tests in the same order.)
class RankVerdict : public ::testing::EmptyTestEventListener {
 public:
  RankVerdict(int rank, int size) : rank_(rank), flags_(size) {}
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const int failed = info.result()->Failed() ? 1 : 0;
    MPI_Gather(&failed, 1, MPI_INT, flags_.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (rank_ != 0) return;
    std::string ranks;
    for (std::size_t r = 1; r < flags_.size(); ++r) {
      if (!flags_[r]) continue;
      if (!ranks.empty()) ranks += ',';
      ranks += std::to_string(r);
    }
    if (!ranks.empty())
      std::fprintf(stderr, "[  FAILED  ] %s.%s on rank(s) %s\n", info.test_suite_name(), info.name(), ranks.c_str());
  }

 private:
  int rank_;
  std::vector<int> flags_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);

  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  listeners.Append(new RankVerdict(rank, size));
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    delete listeners.Release(listeners.default_xml_generator());  // one XML file, from rank 0
    listeners.Append(new RankFailurePrinter(rank));
  }

  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  // A test that failed on rank 2 only must fail the run on rank 0 too.
  int any_failed = failed;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any_failed && !failed) std::fprintf(stderr, "FAILED: tests failed on other ranks (see above)\n");
  MPI_Finalize();
  return any_failed;
}
