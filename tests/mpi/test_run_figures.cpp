// The figures a run agrees on across ranks before it writes them, on 2 and 3
// ranks: the summary's memory is the largest rank's (the lowest of equals),
// a collective row's transfer time is its group's largest member's, rows
// that do not pair up across a group keep each rank's own time, and a host
// estimate of a non-blocking collective counts only the time every member
// was inside MPI.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string_view>
#include <vector>

#include "src/comm/comm_log.hpp"
#include "src/train/run_report.hpp"
#include "tests/mpi/mpi_world.hpp"

namespace {

using strata::mpi_test::world_rank;
using strata::mpi_test::world_size;
using namespace strata;

TEST(RunFigures, SummaryMemoryIsTheLargestRanks) {
  const int r = world_rank(), n = world_size();
  train::Summary s;
  // Rank r holds r + 1 params and 10 - r grads: the totals are 11 on every
  // rank, so the lowest rank wins the tie...
  s.peak_bytes[int(core::MemCategory::params)] = std::uint64_t(r + 1);
  s.peak_bytes[int(core::MemCategory::grads)] = std::uint64_t(10 - r);
  s.peak_total = 11;
  train::take_largest_rank_memory(s, MPI_COMM_WORLD);
  EXPECT_EQ(s.peak_rank, 0);
  EXPECT_EQ(s.peak_bytes[int(core::MemCategory::params)], 1u);
  EXPECT_EQ(s.peak_total, 11u);
  // ...and the last rank's is taken, whole, once it holds the most.
  train::Summary t;
  t.peak_bytes[int(core::MemCategory::optimizer)] = std::uint64_t(100 * (r + 1));
  t.peak_bytes[int(core::MemCategory::activations)] = std::uint64_t(r);
  t.peak_total = std::uint64_t(101 * r + 100);
  train::take_largest_rank_memory(t, MPI_COMM_WORLD);
  EXPECT_EQ(t.peak_rank, n - 1);
  EXPECT_EQ(t.peak_bytes[int(core::MemCategory::optimizer)], std::uint64_t(100 * n));
  EXPECT_EQ(t.peak_bytes[int(core::MemCategory::activations)], std::uint64_t(n - 1));
  EXPECT_EQ(t.peak_total, std::uint64_t(101 * (n - 1) + 100));
}

train::CommAggregate row(const char* axis, const char* op, double time) {
  train::CommAggregate a;
  a.axis = axis, a.op = op, a.group_size = world_size(), a.size_class = 1 << 22, a.count = 1;
  a.bytes = double(1 << 22), a.time = a.group_time = time;
  return a;
}

TEST(RunFigures, CollectiveRowsTakeTheGroupsLargestTime) {
  const int r = world_rank();
  std::vector<train::CommAggregate> rows = {row("dp", "all_reduce", 0.001 * (r + 1)),
                                            row("dp", "send", 0.5 + r), row("dp", "all_gather", 0.010 - 0.001 * r)};
  train::take_group_transfer_times(rows, {"world", "dp", "tp"}, [](std::string_view axis) {
    return axis == "dp" ? MPI_COMM_WORLD : MPI_COMM_NULL;
  });
  EXPECT_DOUBLE_EQ(rows[0].group_time, 0.001 * world_size());
  EXPECT_DOUBLE_EQ(rows[0].time, 0.001 * (r + 1));  // the rank's own stays
  EXPECT_DOUBLE_EQ(rows[1].group_time, 0.5 + r);    // point-to-point: its own
  EXPECT_DOUBLE_EQ(rows[2].group_time, 0.010);
  EXPECT_DOUBLE_EQ(rows[0].algbw(), double(1 << 22) / (0.001 * world_size()));
}

TEST(RunFigures, RowsThatDoNotPairUpKeepTheirOwnTime) {
  const int r = world_rank();
  // Rank 0 has one more collective row than the others: nothing is paired.
  std::vector<train::CommAggregate> rows = {row("dp", "all_reduce", 1.0 + r)};
  if (r == 0) rows.push_back(row("dp", "broadcast", 7.0));
  train::take_group_transfer_times(rows, {"world", "dp", "tp"}, [](std::string_view axis) {
    return axis == "dp" ? MPI_COMM_WORLD : MPI_COMM_NULL;
  });
  EXPECT_DOUBLE_EQ(rows[0].group_time, 1.0 + r);
}

// Two non-blocking all-reduces on dp, estimated on the host, each alone in
// flight while rank r was inside MPI: call a during [10r, 40], call b during
// [100, 101 + r]. Every rank was inside MPI together during [10(n-1), 40]
// and [100, 101] only, so that much is each call's transfer.
TEST(RunFigures, HostEstimatesCountOnlyTimeEveryMemberWasInsideMpi) {
  const int r = world_rank(), n = world_size();
  comm::CommLog log(0.0);
  auto call = [&](double start, double end) {
    comm::CommRecord c{1, "all_reduce", "dp", n, 1 << 22, true, start, end, 0.0};
    c.transfer_end = end, c.transfer_start = start, c.host_estimate = true;
    return log.add(c);
  };
  const std::size_t a = call(10.0 * r, 40.0), b = call(50.0, 101.0 + r);
  // A blocking call of another axis, which is left alone.
  comm::CommRecord blocking{1, "all_reduce", "tp", n, 8, false, 60.0, 61.0, 1.0};
  blocking.transfer_start = 60.0, blocking.transfer_end = 61.0;
  const std::size_t other = log.add(blocking);
  comm::HostProgress& p = log.progress();
  p.in_flight.push_back({a, 3.0, 0.0});
  p.spent(10.0 * r, 40.0);
  p.complete(a);
  p.in_flight.push_back({b, 1.0, 0.0});
  p.spent(100.0, 101.0 + r);
  p.complete(b);
  train::share_progress_with_group(log, {"world", "dp", "tp"}, [](std::string_view axis) {
    return axis == "dp" ? MPI_COMM_WORLD : MPI_COMM_NULL;
  });
  // Call 0: [10(n-1), 40] of every member's; call 1: [100, 101].
  EXPECT_DOUBLE_EQ(log.at(a).transfer(), 40.0 - 10.0 * (n - 1));
  EXPECT_DOUBLE_EQ(log.at(a).transfer_end, 40.0);
  EXPECT_DOUBLE_EQ(log.at(b).transfer(), 1.0);
  EXPECT_DOUBLE_EQ(log.at(b).transfer_end, 101.0 + r);
  EXPECT_DOUBLE_EQ(log.at(other).transfer(), 1.0);
}

}  // namespace
