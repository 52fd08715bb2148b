#include "src/train/estimate.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "kernels/foundation/clock.hpp"
#include "kernels/kernels.hpp"
#include "src/train/records.hpp"
#include "src/train/trainer.hpp"
#include "strategies/registry.hpp"

namespace strata::train {

std::vector<CommVolume> comm_volumes(const std::vector<comm::CommRecord>& records, int step) {
  std::vector<CommVolume> out;
  for (const auto& r : records) {
    if (r.step != step) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const CommVolume& v) { return v.axis == r.axis && v.op == r.op; });
    if (it == out.end()) it = out.insert(out.end(), CommVolume{r.axis, r.op, r.group_size});
    ++it->calls;
    it->bytes += r.bytes;
  }
  return out;
}

namespace {

// The meta device for a scope, then the device (and GPU) the process had.
class OnMeta {
 public:
  OnMeta() : saved_(kernels::device()), ordinal_(kernels::device_ordinal()) {
    kernels::use_device(kernels::Device::meta);
  }
  ~OnMeta() { kernels::use_device(saved_, ordinal_); }
  OnMeta(const OnMeta&) = delete;
  OnMeta& operator=(const OnMeta&) = delete;

 private:
  kernels::Device saved_;
  int ordinal_;
};

}  // namespace

RankMemory estimate_rank(const plan::Plan& cfg, int rank, std::vector<CommVolume>* comm,
                         std::vector<kernels::WorkCost>* compute, prof::Trace* trace, RankClass* cls) {
  const OnMeta meta;
  comm::CommLog log(prof::now_seconds());
  log.untimed();  // meta calls take no time: their records say what they move
  mesh::Mesh mesh(strategies::layout_of(cfg), rank, log);
  core::MemoryTracker tracker;
  tracker.count_only();
  // Records nothing: it only carries the micro-batch and chunk into the trace's spans.
  prof::Timeline positions(false);
  Trainer t(cfg, tracker, &positions, 0.0, strategies::parallelize(cfg, &mesh));
  // As run_deck measures: peaks restart with each step.
  for (int s = 0; s < 2; ++s) {
    log.set_step(s);
    tracker.reset_peaks();
    kernels::reset_meta_costs();
    const prof::TraceScope scope(s == 1 ? trace : nullptr);
    t.step(s);
  }
  if (comm != nullptr) *comm = comm_volumes(log.records(), 1);
  if (compute != nullptr) *compute = kernels::meta_costs();
  if (cls != nullptr) {
    const RecordWindow w = record_window(cfg, t.units().size(), t.micro_batches());
    cls->record_window_bytes = w.bytes;
    cls->record_window_steps = w.steps;
  }
  return rank_memory(tracker, t.host_tracker(), t.nvme_file());
}

Estimate estimate(const plan::Plan& cfg, bool with_traces) {
  const mesh::Layout l = strategies::layout_of(cfg);
  Estimate e;
  e.world = l.world();
  // A pipeline stage's ranks are alike but for their shards and experts.
  std::vector<std::vector<int>> stages(std::size_t(l.size("pp")));
  for (int r = 0; r < l.world(); ++r) stages[std::size_t(mesh::coord(l, r, "pp"))].push_back(r);
  for (const std::vector<int>& stage : stages) {
    std::vector<CommVolume> comm;
    std::vector<kernels::WorkCost> compute;
    prof::Trace trace;
    RankClass window;  // a stage's ranks have the same units and micro-batches
    const RankMemory first =
        estimate_rank(cfg, stage.front(), &comm, &compute, with_traces ? &trace : nullptr, &window);
    const auto with_window = [&](RankClass k) {
      k.record_window_bytes = window.record_window_bytes;
      k.record_window_steps = window.record_window_steps;
      return k;
    };
    const bool alike = stage.size() == 1 || estimate_rank(cfg, stage.back()) == first;
    if (alike) {
      e.classes.push_back(with_window({stage, first, comm, compute, std::move(trace)}));
      continue;
    }
    // Ranks of this stage differ: each is estimated, and equal ones grouped.
    const std::size_t begin = e.classes.size();
    for (int r : stage) {
      std::vector<CommVolume> c = comm;
      std::vector<kernels::WorkCost> w = compute;
      prof::Trace tr;
      const RankMemory m = r == stage.front() ? first : estimate_rank(cfg, r, &c, &w, with_traces ? &tr : nullptr);
      if (r == stage.front()) tr = trace;
      auto it = std::find_if(e.classes.begin() + std::ptrdiff_t(begin), e.classes.end(),
                             [&](const RankClass& k) { return k.memory == m; });
      if (it == e.classes.end())
        e.classes.push_back(with_window({{r}, m, c, w, std::move(tr)}));
      else
        it->ranks.push_back(r);
    }
  }
  // By first rank, whatever the order of the mesh's dims (the reports write
  // a class's rows in this order).
  std::sort(e.classes.begin(), e.classes.end(),
            [](const RankClass& a, const RankClass& b) { return a.ranks.front() < b.ranks.front(); });
  const std::uint64_t limits[2] = {cfg.backend.memory_limit, cfg.backend.host_memory_limit};
  for (const RankClass& k : e.classes)
    for (int p = 0; p < 2; ++p) {
      const std::uint64_t peak = k.memory.pools[std::size_t(p)].total_peak;
      if (limits[p] != 0 && peak > limits[p])
        e.does_not_fit.push_back(fmt::format("ranks {}: {} peak {} exceeds backend.{} = {}", rank_ranges(k.ranks),
                                             core::pool_name(core::Pool(p)), core::format_bytes(double(peak)),
                                             p == 0 ? "memory_limit" : "host_memory_limit",
                                             core::format_bytes(double(limits[p]))));
    }
  return e;
}

std::string rank_ranges(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += fmt::format("{}{}", out.empty() ? "" : ",", j == i ? fmt::format("{}", ranks[i])
                                                               : fmt::format("{}-{}", ranks[i], ranks[j]));
    i = j + 1;
  }
  return out;
}

}  // namespace strata::train
