// Side by side: raw MPI_Allreduce against the profiled communicator's
// all_reduce on the same buffer and communicator, to show what profiling
// costs. Plain main (it runs under mpiexec); rank 0 prints one table.
// --reserve: the log is reserved up front, as a trainer that knows its call count does.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "src/comm/comm_log.hpp"
#include "src/comm/mpi_check.hpp"
#include "src/comm/mpi_communicator.hpp"
#include "src/comm/profiled_communicator.hpp"
#include "kernels/foundation/clock.hpp"

namespace {

using namespace strata;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Seconds per call of `iters` back-to-back calls, started together after a barrier.
template <typename F>
double time_calls(MPI_Comm comm, int iters, F&& call) {
  STRATA_CHECK_MPI(MPI_Barrier(comm));
  const double t0 = prof::now_seconds();
  for (int i = 0; i < iters; ++i) call();
  return (prof::now_seconds() - t0) / iters;
}

int run(bool reserve) {
  MPI_Comm comm;
  STRATA_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  STRATA_CHECK_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  int rank = 0, n = 1;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  STRATA_CHECK_MPI(MPI_Comm_size(comm, &n));

  comm::CommLog log(prof::now_seconds());
  if (reserve) log.reserve(std::size_t(1) << 14);  // more than the run records
  comm::ProfiledCommunicator prof_comm(std::make_unique<comm::MpiCommunicator>(comm, "world"), log);

  const std::int64_t max_bytes = std::int64_t(64) << 20;
  // Zeros: repeated in-place sums stay finite, so no call meets inf or NaN.
  std::vector<float> buf(max_bytes / sizeof(float), 0.0f);
  const double bus_factor = n > 1 ? 2.0 * (n - 1) / n : 1.0;
  const int pairs = 15;  // interleaved (raw, profiled) samples per size

  if (rank == 0) {
    std::printf("# all_reduce f32 sum in place, %d ranks, median of %d interleaved samples, log %s\n", n, pairs,
                reserve ? "reserved up front (--reserve)" : "growing");
    std::printf("# busbw = algbw * 2(n-1)/n (nccl-tests); ratio = profiled/raw bandwidth\n");
    std::printf("%10s %6s %12s %12s %10s %10s %10s %10s %8s\n", "bytes", "iters", "raw_us", "prof_us", "raw_alg",
                "raw_bus", "prof_alg", "prof_bus", "ratio");
    std::printf("%10s %6s %12s %12s %10s %10s %10s %10s %8s\n", "", "", "", "", "GB/s", "GB/s", "GB/s", "GB/s", "");
  }
  for (std::int64_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
    const std::int64_t count = bytes / std::int64_t(sizeof(float));
    // Messages up to 4 MiB are timed over at least 4 back-to-back calls (as
    // nccl-tests times many): one call after a barrier also times the
    // ranks' skew leaving it, which at 4 MiB cost a fifth of the bandwidth.
    const int iters = int(std::clamp<std::int64_t>((std::int64_t(16) << 20) / bytes, 1, 100));
    auto raw = [&] {
      STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, buf.data(), int(count), MPI_FLOAT, MPI_SUM, comm));
    };
    auto profiled = [&] { prof_comm.all_reduce(buf.data(), count, comm::DType::f32, comm::ReduceOp::sum); };
    raw(), profiled();  // warm-up: first-touch and connection setup
    std::vector<double> t_raw, t_prof;
    for (int s = 0; s < pairs; ++s) {
      t_raw.push_back(time_calls(comm, iters, raw));
      t_prof.push_back(time_calls(comm, iters, profiled));
    }
    // The slowest rank's median is the collective's time.
    double med[2] = {median(t_raw), median(t_prof)}, worst[2];
    STRATA_CHECK_MPI(MPI_Reduce(med, worst, 2, MPI_DOUBLE, MPI_MAX, 0, comm));
    if (rank == 0) {
      const double alg_raw = double(bytes) / worst[0] / 1e9, alg_prof = double(bytes) / worst[1] / 1e9;
      std::printf("%10lld %6d %12.2f %12.2f %10.3f %10.3f %10.3f %10.3f %8.3f\n", (long long)bytes, iters,
                  worst[0] * 1e6, worst[1] * 1e6, alg_raw, alg_raw * bus_factor, alg_prof, alg_prof * bus_factor,
                  alg_prof / alg_raw);
    }
  }
  if (rank == 0)
    std::printf("# profiling log: %zu records of %zu B (each new page of the log costs a page fault)\n",
                log.records().size(), sizeof(comm::CommRecord));
  STRATA_CHECK_MPI(MPI_Comm_free(&comm));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    rc = run(argc > 1 && std::string(argv[1]) == "--reserve");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_comm: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
