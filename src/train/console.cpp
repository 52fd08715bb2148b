#include "src/train/console.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "kernels/foundation/clock.hpp"
#include "kernels/foundation/median.hpp"
#include "src/comm/mpi_check.hpp"

namespace strata::train {

using prof::format_duration;

void StepConsole::header() const {
  fmt::print("{:>11} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9} {:>6} {:>8} {:>5} {:>8} {:>8}", "step", "loss", "lr",
             "grad_norm", "time_ms", "tokens/s", "tok/s/dev", "MFU%", "mem_GiB", "mem%", "elapsed", "ETA");
  if (fp16) fmt::print(" {:>9}", "scale");
  if (moe) fmt::print(" {:>8} {:>6} {:>6}", "aux", "imbal", "drop%");
  fmt::print("\n");
}

void StepConsole::add(const StepRecord& r, double device_peak) {
  Interval& i = interval;
  ++i.steps;
  i.loss += r.loss;
  i.time += r.step_time;
  if (!r.warmup) ++i.measured, i.measured_time += r.step_time;
  i.peak = std::max(i.peak, device_peak);
}

void StepConsole::line(const StepRecord& r) {
  const Interval i = interval;
  interval = {};
  const double elapsed = prof::now_seconds() - started;
  const int done = r.step - first_step + 1, left = total_steps - 1 - r.step;
  // The mean over the interval's measured steps (all of them if none is);
  // the rates follow from it as a step's follow from its time.
  const double time = i.measured > 0 ? i.measured_time / i.measured : i.steps > 0 ? i.time / i.steps : r.step_time;
  const double scale = time > 0 ? r.step_time / time : 0;
  const std::string share = device_bytes > 0 ? fmt::format("{:.1f}", 100.0 * i.peak / device_bytes) : "-";
  fmt::print("{:>11} {:>9.5f} {:>9.2e} {:>9.4f} {:>9.2f} {:>10.0f} {:>9.0f} {:>6.2f} {:>8.3f} {:>5} {:>8} {:>8}",
             fmt::format("{}/{}", r.step + 1, total_steps), i.steps > 0 ? i.loss / i.steps : r.loss, r.lr,
             r.grad_norm, time * 1e3, r.tokens_per_s * scale, r.tokens_per_s * scale / world, 100.0 * r.mfu * scale,
             i.peak / double(1ull << 30), share, format_duration(elapsed),
             format_duration(done > 0 ? elapsed / done * left : 0));
  if (fp16) fmt::print(" {:>9g}", r.loss_scale);
  if (moe) fmt::print(" {:>8.5f} {:>6.2f} {:>6.2f}", r.moe_aux, r.load_imbalance, 100.0 * r.drop_rate);
  if (r.warmup) fmt::print("  (warm-up)");
  if (r.skipped) fmt::print("  (skipped: fp16 overflow at loss scale {:g})", r.loss_scale);
  if (!std::isfinite(r.loss)) fmt::print("  (loss not finite)");
  fmt::print("\n");
  std::fflush(stdout);
}

std::string cores_shared_warning(MPI_Comm comm, int threads) {
  const comm::NodePlace here = comm::node_place(comm);
  cpu_set_t set;
  CPU_ZERO(&set);
  int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : int(sysconf(_SC_NPROCESSORS_ONLN));
  // The most oversubscribed node decides: threads per core there.
  struct {
    double ratio;
    int rank;
  } in{double(here.size) * threads / std::max(cores, 1), 0}, out{};
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &in.rank));
  STRATA_CHECK_MPI(MPI_Allreduce(&in, &out, 1, MPI_DOUBLE_INT, MPI_MAXLOC, comm));
  double ranks_threads_cores[3] = {double(here.size), double(threads), double(cores)};
  STRATA_CHECK_MPI(MPI_Bcast(ranks_threads_cores, 3, MPI_DOUBLE, out.rank, comm));
  if (out.ratio <= 1.0) return "";
  return fmt::format(
      "{:.0f} rank(s) x {:.0f} thread(s) share {:.0f} core(s) on one node: step times, the pipeline bubble and "
      "bandwidths measure this machine's time-sharing, not the hardware",
      ranks_threads_cores[0], ranks_threads_cores[1], ranks_threads_cores[2]);
}

void print_memory_per_rank(MPI_Comm comm, const RunningSummary& device) {
  int rank = 0, size = 1;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  STRATA_CHECK_MPI(MPI_Comm_size(comm, &size));
  constexpr int K = core::kNumMemCategories;
  std::vector<double> mine(2 * K, 0.0), all(std::size_t(2 * K) * size);
  for (int c = 0; c < K; ++c) {
    mine[std::size_t(c)] = double(device.held_bytes[c]);
    mine[std::size_t(K + c)] = double(device.peak_bytes[c]);
  }
  STRATA_CHECK_MPI(MPI_Gather(mine.data(), 2 * K, MPI_DOUBLE, all.data(), 2 * K, MPI_DOUBLE, 0, comm));
  if (rank != 0) return;
  auto at = [&](int r, int i) { return all[std::size_t(r) * 2 * K + std::size_t(i)]; };
  auto cells = [&](auto held, auto peak) {
    for (int c = 0; c < K; ++c)
      fmt::print(" {:>23}", fmt::format("{} / {}", core::format_bytes(held(c)), core::format_bytes(peak(c))));
    fmt::print("\n");
  };
  const char* what = "memory per rank (held at the end / peak during a step)";
  if (size <= 8) {
    fmt::print("{}:\n  {:>6}", what, "rank");
    for (int c = 0; c < K; ++c) fmt::print(" {:>23}", core::category_name(core::MemCategory(c)));
    fmt::print("\n");
    for (int r = 0; r < size; ++r) {
      fmt::print("  {:>6}", r);
      cells([&](int c) { return at(r, c); }, [&](int c) { return at(r, K + c); });
    }
    return;
  }
  // Above 8 ranks: the spread over ranks, and the rank with the largest
  // summed peak (what must fit) in full.
  std::vector<double> total(std::size_t(size), 0.0);
  for (int r = 0; r < size; ++r)
    for (int c = 0; c < K; ++c) total[std::size_t(r)] += at(r, K + c);
  const int worst = int(std::max_element(total.begin(), total.end()) - total.begin());
  fmt::print("{}, over {} ranks: min / median / max per category, and the rank with the largest total peak:\n  {:>10}",
             what, size, "");
  for (int c = 0; c < K; ++c) fmt::print(" {:>23}", core::category_name(core::MemCategory(c)));
  fmt::print("\n");
  auto stat = [&](int i, auto f) {
    std::vector<double> v;
    for (int r = 0; r < size; ++r) v.push_back(at(r, i));
    return f(v);
  };
  const auto lo = [](std::vector<double> v) { return *std::min_element(v.begin(), v.end()); };
  const auto hi = [](std::vector<double> v) { return *std::max_element(v.begin(), v.end()); };
  fmt::print("  {:>10}", "min");
  cells([&](int c) { return stat(c, lo); }, [&](int c) { return stat(K + c, lo); });
  fmt::print("  {:>10}", "median");
  cells([&](int c) { return stat(c, core::median); }, [&](int c) { return stat(K + c, core::median); });
  fmt::print("  {:>10}", "max");
  cells([&](int c) { return stat(c, hi); }, [&](int c) { return stat(K + c, hi); });
  fmt::print("  {:>10}", fmt::format("rank {}", worst));
  cells([&](int c) { return at(worst, c); }, [&](int c) { return at(worst, K + c); });
}

void print_bubbles(MPI_Comm comm, const Bubble& b, const std::string& formula) {
  int rank = 0, size = 1;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  STRATA_CHECK_MPI(MPI_Comm_size(comm, &size));
  double mine[3] = {double(b.pp_rank), b.idle_over_step, b.idle_over_compute};
  std::vector<double> all(std::size_t(3 * size));
  STRATA_CHECK_MPI(MPI_Gather(mine, 3, MPI_DOUBLE, all.data(), 3, MPI_DOUBLE, 0, comm));
  if (rank != 0) return;
  fmt::print("pipeline bubble ({}, p {}, m {}, v {}; theory {} = {:.3f}):\n", b.schedule, b.stages, b.micro_batches,
             b.virtual_stages, formula, b.theory);
  if (size <= 8) {
    for (int r = 0; r < size; ++r)
      fmt::print("  rank {:>3} stage {:>2}: bubble {:.3f} (idle / pipeline time)   idle/compute {:.3f}\n", r,
                 int(all[std::size_t(3 * r)]), all[std::size_t(3 * r + 1)], all[std::size_t(3 * r + 2)]);
    return;
  }
  std::vector<double> bub, over;
  for (int r = 0; r < size; ++r) bub.push_back(all[std::size_t(3 * r + 1)]), over.push_back(all[std::size_t(3 * r + 2)]);
  const int worst = int(std::max_element(bub.begin(), bub.end()) - bub.begin());
  fmt::print("  over {} ranks, bubble (idle / pipeline time): min {:.3f}, median {:.3f}, max {:.3f} (rank {}, stage {}); "
             "idle/compute median {:.3f}\n",
             size, *std::min_element(bub.begin(), bub.end()), core::median(bub), bub[std::size_t(worst)], worst,
             int(all[std::size_t(3 * worst)]), core::median(over));
}

void print_run_end(MPI_Comm comm, const RunRecords& r, const plan::Plan& cfg, const std::string& report,
                   double wall_seconds) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  print_memory_per_rank(comm, r.running());
  if (cfg.parallel.pp > 1 && cfg.run.profile) print_bubbles(comm, r.bubble, cfg.parallel.schedule->formula);
  if (rank != 0) return;
  const Summary& s = r.summary;
  fmt::print("summary: loss {:.4f} -> {:.4f} | {:.0f} tokens/s (median of {} steps) | {:.2f} GFLOP/s | MFU {:.1f}%{}\n",
             s.initial_loss, s.final_loss, s.tokens_per_s, s.measured_steps, s.flops_per_s / 1e9, 100 * s.mfu,
             s.hardware_flops_per_step > s.model_flops_per_step ? fmt::format(" | HFU {:.1f}%", 100 * s.hfu) : "");
  if (!r.comm.empty()) {
    fmt::print("communication on rank 0 over {} measured steps:\n", s.measured_steps);
    fmt::print("  {:<10} {:<15} {:>3} {:>11} {:>7} {:>12} {:>10} {:>10} {:>10} {:>8}\n", "axis", "op", "n", "size <=",
               "calls", "bytes", "xfer_ms", "algbw_GB/s", "busbw_GB/s", "hidden");
    for (const auto& a : r.comm)
      fmt::print("  {:<10} {:<15} {:>3} {:>11} {:>7} {:>12.0f} {:>10.2f} {:>10.3f} {:>10.3f} {:>7.0f}%\n", a.axis, a.op,
                 a.group_size, core::format_bytes(double(a.size_class)), a.count, a.bytes, a.group_time * 1e3,
                 a.algbw() / 1e9, a.busbw() / 1e9, 100.0 * a.hidden_fraction());
  }
  fmt::print("wall time {} for {} step(s)\n", format_duration(wall_seconds), r.running().steps);
  fmt::print("report: {}\n", report);
}

}  // namespace strata::train
