#include "src/train/dry_run.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

#include <fmt/format.h>

#include "kernels/foundation/error.hpp"
#include "kernels/kernels.hpp"
#include "models/model.hpp"
#include "src/comm/mpi_check.hpp"
#include "src/report/h5file.hpp"
#include "src/train/estimate.hpp"
#include "src/train/paths.hpp"
#include "src/train/run_report.hpp"
#include "strategies/registry.hpp"

namespace strata::train {

namespace {

// The dry run's estimate, printed: per class of ranks with identical
// figures, each pool's bytes per category held at the end of a step and at
// its peak, and the collectives a rank of the class issues per step.
void print_estimate(const deck::Deck& deck, const Estimate& e, std::int64_t params) {
  fmt::print("# resolved configuration ({})\n{}\n", deck.path, deck.resolved_toml);
  fmt::print("parameters: {} ({:.3f} M)\n", params, double(params) / 1e6);
  constexpr int K = core::kNumMemCategories;
  fmt::print("memory estimate, {} rank(s) in {} class(es) of identical figures (a step run on the meta device; "
             "held at its end, and peak during it):\n",
             e.world, e.classes.size());
  fmt::print("  {:<16} {:<6} {:<4}", "ranks", "pool", "");
  for (int c = 0; c < K; ++c) fmt::print(" {:>11}", core::category_name(core::MemCategory(c)));
  fmt::print(" {:>11}\n", "total");
  for (const RankClass& k : e.classes) {
    const std::string who = rank_ranges(k.ranks);
    for (int p = 0; p < core::kNumPools; ++p) {
      const auto pool = core::Pool(p);
      if (!uses_pool(deck.config, pool)) continue;
      const PoolFigures& f = k.memory[pool];
      fmt::print("  {:<16} {:<6} {:<4}", p == 0 ? who : "", core::pool_name(pool), "held");
      for (int c = 0; c < K; ++c) fmt::print(" {:>11}", core::format_bytes(double(f.held[std::size_t(c)])));
      fmt::print(" {:>11}\n  {:<16} {:<6} {:<4}", core::format_bytes(double(f.total_held())), "", "", "peak");
      for (int c = 0; c < K; ++c) fmt::print(" {:>11}", core::format_bytes(double(f.peak[std::size_t(c)])));
      fmt::print(" {:>11}\n", core::format_bytes(double(f.total_peak)));
    }
  }
  fmt::print("communication per step (a rank of each class):\n");
  for (const RankClass& k : e.classes) {
    fmt::print("  ranks {}:{}\n", rank_ranges(k.ranks), k.comm.empty() ? " none" : "");
    for (const CommVolume& v : k.comm)
      fmt::print("    {:<6} {:<15} n {:>4} {:>6} call(s) {:>12}\n", v.axis, v.op, v.group_size, v.calls,
                 core::format_bytes(double(v.bytes)));
  }
  fmt::print("compute per step (a rank of each class; its kernels counted on the meta device):\n");
  fmt::print("  {:<16} {:<16} {:>14} {:>14} {:>12} {:>8}\n", "ranks", "phase", "matmul GFLOP", "other GFLOP",
             "moved GB", "kernels");
  for (const RankClass& k : e.classes) {
    std::map<std::string, kernels::WorkCost> phases;
    for (const auto& w : k.compute) {
      auto& p = phases[w.phase];
      p.matmul_flops += w.matmul_flops, p.other_flops += w.other_flops, p.bytes += w.bytes, p.kernels += w.kernels;
    }
    bool first_line = true;
    for (const auto& [phase, p] : phases) {
      fmt::print("  {:<16} {:<16} {:>14.3f} {:>14.3f} {:>12.3f} {:>8}\n", first_line ? rank_ranges(k.ranks) : "",
                 phase, p.matmul_flops / 1e9, p.other_flops / 1e9, p.bytes / 1e9, p.kernels);
      first_line = false;
    }
  }
  const auto most = std::max_element(e.classes.begin(), e.classes.end(), [](const RankClass& a, const RankClass& b) {
    return a.record_window_bytes < b.record_window_bytes;
  });
  if (most != e.classes.end())
    fmt::print("report records: {} per rank on the host at most (ranks {}), written to the report every {} step(s) "
               "(run.flush_every), and 32 B a step kept for the summary\n",
               core::format_bytes(most->record_window_bytes), rank_ranges(most->ranks), most->record_window_steps);
  const auto& b = deck.config.backend;
  if (b.memory_limit != 0 || b.host_memory_limit != 0) {
    if (e.does_not_fit.empty())
      fmt::print("fits: every rank's peak is within backend.memory_limit{}\n",
                 b.host_memory_limit != 0 ? " and backend.host_memory_limit" : "");
    for (const auto& line : e.does_not_fit) fmt::print("DOES NOT FIT: {}\n", line);
  }
}

// The estimate as a report: the provenance of a run, status "estimate", the
// /memory table a run writes, one row per rank class, pool and category of
// the estimated step (numbered 0), and /compute per rank class, layer and
// phase.
void write_estimate_report(const deck::Deck& deck, const RunOptions& options, const Estimate& e) {
  report::H5File file(MPI_COMM_SELF, options.output);
  const Provenance prov = provenance(deck, options.command_line, "meta");
  write_provenance(file, prov);
  // What the deck resolves to, under the names a run's summary gives them,
  // so that a reader names an estimate as it names a run; no figure of a
  // step (nothing ran).
  file.write_scalar("summary", "precision", prov.precision, "fp32, or the 16-bit format of mixed precision (bf16, fp16)");
  file.write_scalar("summary", "parameters", double(prov.parameters), "1", "number of model parameters");
  file.write_scalar("summary", "layout", prov.layout, "process mesh: pp x dp x tp");
  file.write_scalar("summary", "strategy", prov.strategy, "state strategy: dp, zero1, zero2 or zero3");
  file.set_attr("/", "device", std::string(plan::name_of(deck.config.backend.device)));
  std::vector<std::vector<int>> classes;
  std::vector<MemoryRecord> rows;
  for (const RankClass& k : e.classes) {  // by first rank
    classes.push_back(k.ranks);
    for (const auto& m : memory_records(k.ranks.front(), 0, k.memory, deck.config)) rows.push_back(m);
  }
  write_rank_classes(file, classes);
  write_memory_table(file, rows);
  report::Table compute("compute", "one step's kernels per rank class, layer and phase, counted on the meta device");
  compute.col_i64("rank", "1", "the first rank of the class (every rank of it does the same work)")
      .col_str("ranks", 64, "", "the ranks of the class, as ranges: 0-3,8")
      .col_i64("layer", "1", "0 embedding, 1..L transformer blocks, L+1 final norm, head and loss, -1 whole-model work")
      .col_str("phase", 16, "", "forward, backward, backward_input, backward_weight, recompute or optimizer")
      .col_f64("matmul_flops", "FLOP", "matrix products: GEMMs and attention's two products (full T x T square)")
      .col_f64("other_flops", "FLOP", "every other operation's arithmetic")
      .col_f64("bytes", "B", "bytes the kernels read and write, each once")
      .col_i64("kernels", "1", "kernels launched");
  for (const RankClass& k : e.classes)
    for (const auto& w : k.compute)
      compute.add_row({std::int64_t(k.ranks.front()), rank_ranges(k.ranks).substr(0, 63), std::int64_t(w.layer),
                       w.phase, w.matmul_flops, w.other_flops, w.bytes, std::int64_t(w.kernels)});
  file.write_table(compute);
  // Whether it fits, where the deck names a device's capacity
  // (backend.memory_limit), as a simulation's report says it.
  const std::uint64_t capacity = deck.config.backend.memory_limit;
  file.set_attr("/", "memory_capacity", std::int64_t(capacity));
  if (capacity != 0 || deck.config.backend.host_memory_limit != 0)
    file.set_attr("/", "fits", std::int64_t(e.does_not_fit.empty()));
  file.set_attr("/", "status", "estimate");
  file.publish();
}

}  // namespace

// --dry-run: the estimate of every rank of the layout, computed by rank 0 of
// whatever launched it (one process is enough, at any scale); the others
// take its verdict, so that an error ends every rank alike. Exit status 3
// when a rank's peak exceeds a memory limit.
int dry_run(const deck::Deck& deck, const RunOptions& options, MPI_Comm comm) {
  const plan::Plan& cfg = deck.config;
  int rank = 0;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  // status, error kind (0 none, 1 input, 2 runtime), and the message.
  int verdict[2] = {0, 0};
  std::string message;
  if (rank == 0) {
    try {
      if (!options.output.empty())
        check_output_paths(MPI_COMM_SELF, options.output, "", options.force, "", false, run_inputs(deck, options.resume));
      if (cfg.backend.threads > 0) kernels::set_num_threads(cfg.backend.threads);
      const std::int64_t params = models::parameter_count(cfg);
      const Estimate e = estimate(cfg);
      print_estimate(deck, e, params);
      const mesh::Layout layout = strategies::layout_of(cfg);
      if (layout.world() <= 64)
        fmt::print("process mesh ({}):\n{}", mesh::describe(layout), mesh::layout_table(layout));
      if (!options.output.empty()) {
        write_estimate_report(deck, options, e);
        fmt::print("estimate report: {}\n", options.output);
      }
      verdict[0] = e.does_not_fit.empty() ? 0 : 3;
    } catch (const core::Error& err) {
      verdict[1] = err.kind() == core::ErrorKind::input ? 1 : 2;
      message = err.what();
    } catch (const std::exception& err) {
      verdict[1] = 2;
      message = err.what();
    }
    std::fflush(stdout);
  }
  STRATA_CHECK_MPI(MPI_Bcast(verdict, 2, MPI_INT, 0, comm));
  if (verdict[1] != 0)
    throw core::Error(verdict[1] == 1 ? core::ErrorKind::input : core::ErrorKind::runtime,
                      comm::broadcast_string(message, comm));
  return verdict[0];
}

}  // namespace strata::train
