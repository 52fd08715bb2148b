#include "src/train/simulate.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <cmath>
#include <ctime>
#include <limits>

#include <fmt/format.h>

#include "kernels/kernels.hpp"
#include "src/comm/backend.hpp"
#include "models/model.hpp"
#include "src/report/h5file.hpp"
#include "kernels/foundation/error.hpp"
#include "src/report/output_path.hpp"
#include "src/train/paths.hpp"
#include "src/train/run_report.hpp"
#include "src/train/trainer.hpp"
#include "strategies/registry.hpp"

namespace strata::train {

void set_throughput(Prediction& out, const plan::Plan& cfg, const sim::Machine& machine, double t) {
  const models::Family& family = models::family(cfg);
  out.model_flops = family.model_flops(cfg, cfg.data.global_batch);
  out.hardware_flops = family.hardware_flops(cfg, cfg.data.global_batch);
  out.peak_flops = machine.peak(cfg.backend.precision) * strategies::layout_of(cfg).world();
  out.tokens_per_s = t > 0 ? double(cfg.data.global_batch) * cfg.model.seq_len / t : 0;
  out.mfu = t > 0 && out.peak_flops > 0 ? out.model_flops / t / out.peak_flops : 0;
  out.hfu = t > 0 && out.peak_flops > 0 ? out.hardware_flops / t / out.peak_flops : 0;
}

Prediction predict(const plan::Plan& cfg, const sim::Machine& machine, const sim::SimOptions& options) {
  Estimate e = estimate(cfg, true);
  Prediction out = replay(e, cfg, machine, options);
  out.estimate = std::move(e);
  return out;
}

Prediction replay(const Estimate& e, const plan::Plan& cfg, const sim::Machine& machine,
                  const sim::SimOptions& options) {
  const mesh::Layout l = strategies::layout_of(cfg);
  std::vector<const prof::Trace*> traces(std::size_t(l.size("pp")), nullptr);
  for (int s = 0; s < l.size("pp"); ++s) {
    const int r = options.ranks.empty() ? mesh::rank_at(l, {{"pp", s}}) : options.ranks[std::size_t(s)];
    for (const RankClass& k : e.classes)
      if (std::find(k.ranks.begin(), k.ranks.end(), r) != k.ranks.end()) traces[std::size_t(s)] = &k.trace;
    STRATA_CHECK(traces[std::size_t(s)] != nullptr, "no rank class holds rank {}", r);
  }
  Prediction out;
  out.step = sim::simulate_step(l, traces, machine, cfg.backend.precision, options);
  const double t = out.step.step_time;
  set_throughput(out, cfg, machine, t);
  StepRecord& step = out.step_record;
  step.loss = std::numeric_limits<double>::quiet_NaN();
  step.grad_norm = std::numeric_limits<double>::quiet_NaN();
  step.step_time = t;
  step.tokens = double(cfg.data.global_batch) * cfg.model.seq_len;
  step.tokens_per_s = out.tokens_per_s;
  step.model_flops = out.model_flops;
  step.flops_per_s = t > 0 ? out.model_flops / t : 0;
  step.mfu = out.mfu;
  step.hardware_flops = out.hardware_flops;
  step.hfu = out.hfu;
  const int stages = l.size("pp"), chunks = stages > 1 ? cfg.parallel.virtual_stages : 1;
  for (std::size_t s = 0; s < out.step.stages.size(); ++s) {
    prof::Timeline& tl = out.timelines.emplace_back(false);
    for (const auto& sp : out.step.stages[s].spans) tl.add(sp);
    out.bubbles.push_back(
        measure_bubble(tl, {step}, int(s), stages, cfg.micro_batches(), chunks, *cfg.parallel.schedule));
  }
  return out;
}

double pipeline_wait(const sim::StageTiming& stage, double step_time) {
  double optimizer_begin = step_time, optimizer = 0;
  for (const prof::Span& s : stage.spans)
    if (s.phase == prof::Phase::optimizer)
      optimizer_begin = std::min(optimizer_begin, s.start), optimizer += s.end - s.start;
  double w = 0;
  for (const comm::CommRecord& r : stage.comms)
    if (r.start < optimizer_begin) w += r.wait;
  return step_time > optimizer ? w / (step_time - optimizer) : 0.0;
}

std::vector<BubbleCauses> explain_bubbles(const plan::Plan& cfg, const sim::Machine& machine, const Prediction& pr) {
  sim::SimOptions o;
  o.free_axes = {"*"};
  const Prediction free = replay(pr.estimate, cfg, machine, o);
  // Every axis but the pipeline's free.
  o.free_axes = {"host", "nvme"};
  for (const std::string& a : strategies::layout_of(cfg).axis_names())
    if (a != "pp") o.free_axes.push_back(a);
  const Prediction pipeline = replay(pr.estimate, cfg, machine, o);
  std::vector<BubbleCauses> out;
  for (std::size_t s = 0; s < pr.step.stages.size(); ++s) {
    BubbleCauses c;
    c.bubble = pr.bubbles[s].idle_over_step;
    c.theory = pr.bubbles[s].theory;
    const double waited = pipeline_wait(free.step.stages[s], free.step.step_time);
    c.stages_work = waited - c.theory;
    c.outside = free.bubbles[s].idle_over_step - waited;
    c.transfers = pipeline.bubbles[s].idle_over_step - free.bubbles[s].idle_over_step;
    c.other_axes = c.bubble - pipeline.bubbles[s].idle_over_step;
    out.push_back(c);
  }
  return out;
}

namespace {

// Whether every rank's predicted device peak fits a device: the machine's
// memory, or backend.memory_limit where the deck sets a smaller one. One
// line per class of ranks that does not; capacity 0 when neither is known.
struct Fit {
  std::uint64_t capacity = 0;
  std::vector<std::string> does_not_fit;
};

Fit fit_of(const plan::Plan& cfg, const sim::Machine& machine, const Prediction& pr) {
  Fit f;
  const auto memory = std::uint64_t(std::max(0.0, machine.memory));
  const std::uint64_t limit = cfg.backend.memory_limit;
  f.capacity = limit != 0 && (memory == 0 || limit < memory) ? limit : memory;
  const std::string whose = f.capacity == memory ? fmt::format("the machine's {} per device", core::format_bytes(double(memory)))
                                                 : fmt::format("backend.memory_limit = {}", core::format_bytes(double(limit)));
  for (const RankClass& k : pr.estimate.classes) {
    const std::uint64_t peak = k.memory[core::Pool::device].total_peak;
    if (f.capacity != 0 && peak > f.capacity)
      f.does_not_fit.push_back(fmt::format("ranks {}: device peak {} exceeds {}", rank_ranges(k.ranks),
                                           core::format_bytes(double(peak)), whose));
  }
  return f;
}

void write_report(const deck::Deck& deck, const SimulateOptions& o, const sim::Machine& machine, const Prediction& pr,
                  const Fit& fit, const std::string& path) {
  const plan::Plan& cfg = deck.config;
  const mesh::Layout l = strategies::layout_of(cfg);
  report::H5File file(MPI_COMM_SELF, path);
  Provenance prov = provenance(deck, o.command_line, fmt::format("simulated: {}", machine.name));
  prov.threads = 1;
  describe_software(prov, comm::library_versions(comm::Backend::meta), "simulated: none run");
  prov.peak_flops = pr.peak_flops;
  prov.peak_flops_per_device = machine.peak(cfg.backend.precision);
  prov.peak_source = fmt::format("machine {} ({}): {:.1f} TFLOP/s per device at {}", machine.name, machine.path,
                                 machine.peak(cfg.backend.precision) / 1e12,
                                 core::precision_name(cfg.backend.precision));
  write_provenance(file, prov);
  file.set_attr("/", "simulated", std::int64_t(1));
  file.set_attr("/", "device", std::string(plan::name_of(cfg.backend.device)));
  file.set_attr("/", "machine", machine.name);
  file.set_attr("/", "machine_path", machine.path);
  // One row per class of identical ranks, under its first rank (the
  // estimate's classes, each within one pipeline stage, whose simulated
  // timeline and calls the class's row carries).
  std::vector<std::vector<int>> classes;
  std::vector<MemoryRecord> memory, rank0;
  for (const RankClass& k : pr.estimate.classes) {  // by first rank: rank 0's class first
    classes.push_back(k.ranks);
    for (const auto& m : memory_records(k.ranks.front(), 0, k.memory, cfg)) memory.push_back(m);
    if (k.ranks.front() == 0) rank0 = memory;
  }
  write_rank_classes(file, classes);

  std::vector<StepRecord> steps = {pr.step_record};
  steps[0].exposed_comm.assign(l.axis_names().size(), 0.0);
  std::vector<comm::CommLog> logs(pr.step.stages.size(), comm::CommLog(0.0));
  std::vector<std::vector<CommAggregate>> aggregates;
  for (std::size_t s = 0; s < pr.step.stages.size(); ++s) {
    for (const auto& c : pr.step.stages[s].comms) logs[s].add(c);
    aggregates.push_back(aggregate_comm(logs[s], 0));
    // A simulated call's transfer is its own; blocked beyond it, a
    // collective waited for the group's last member.
    for (CommAggregate& a : aggregates.back())
      if (a.op != "send" && a.op != "recv") a.group_wait = std::max(0.0, a.wait - a.time);
  }
  std::vector<RankRows> rows;
  std::vector<std::pair<int, std::vector<CommAggregate>>> comm_figures;
  std::vector<std::pair<int, Bubble>> bubbles;
  for (const std::vector<int>& k : classes) {
    const int r = k.front();
    const std::size_t s = std::size_t(mesh::coord(l, r, "pp"));
    rows.push_back({r, &steps, nullptr, &pr.timelines[s], &logs[s], "simulated"});
    comm_figures.push_back({r, aggregates[s]});
    bubbles.push_back({r, pr.bubbles[s]});
  }
  write_tables(file, l, rows, memory);
  write_comm_summary(file, comm_figures);
  write_pipeline_summary(file, bubbles);
  Summary summary = summarise(steps, rank0, pr.model_flops, pr.hardware_flops, pr.peak_flops);
  // The memory figures of the largest rank, as a run's summary has them.
  // `memory` is sorted by rank: one run of rows per class.
  for (auto first = memory.begin(); first != memory.end();) {
    const auto last = std::find_if(first, memory.end(), [&](const MemoryRecord& m) { return m.rank != first->rank; });
    const Summary other = summarise({}, {first, last}, 0, 0, 0);
    if (other.peak_total > summary.peak_total) {
      std::copy(std::begin(other.peak_bytes), std::end(other.peak_bytes), std::begin(summary.peak_bytes));
      summary.peak_total = other.peak_total;
      summary.peak_rank = first->rank;
    }
    first = last;
  }
  write_summary(file, summary, prov);
  file.set_attr("/", "memory_capacity", std::int64_t(fit.capacity));
  if (fit.capacity != 0) file.set_attr("/", "fits", std::int64_t(fit.does_not_fit.empty()));
  file.set_attr("/", "status", "complete");
  file.publish();
}

}  // namespace

namespace {

// The intervals a rank is blocked in communication, merged: a blocking call
// waits over its whole span, a non-blocking one for its wait at its end, and
// calls waited for together overlap (a moment blocked counts once).
std::vector<std::pair<double, double>> blocked(const std::vector<comm::CommRecord>& comms) {
  std::vector<std::pair<double, double>> w;
  for (const comm::CommRecord& c : comms)
    if (c.wait > 0) w.push_back({c.nonblocking ? c.end - c.wait : c.start, c.end});
  std::sort(w.begin(), w.end());
  std::vector<std::pair<double, double>> out;
  for (const auto& [a, b] : w) {
    if (!out.empty() && a <= out.back().second) out.back().second = std::max(out.back().second, b);
    else out.push_back({a, b});
  }
  return out;
}

// Of a span [a, b], the time no blocked interval covers: its compute.
double compute_in(double a, double b, const std::vector<std::pair<double, double>>& blocked) {
  double waited = 0;
  for (const auto& [w0, w1] : blocked) waited += std::max(0.0, std::min(b, w1) - std::max(a, w0));
  return std::max(0.0, (b - a) - waited);
}

// Per pipeline stage: compute by phase (its spans less the waits inside
// them), the bubble, and communication by axis and op: transfer, exposed
// (blocked) and hidden share; then the largest causes of exposed time.
void print_breakdown(const Prediction& pr, const mesh::Layout& l) {
  struct Cause {
    double exposed;
    std::size_t stage;
    std::string what;
  };
  std::vector<Cause> causes;
  const double ms = 1e3;
  fmt::print("per stage: compute by phase (spans less the waits in them), bubble, and each axis and op's "
             "transfer, exposed (blocked) and hidden share\n");
  for (std::size_t s = 0; s < pr.step.stages.size(); ++s) {
    const sim::StageTiming& st = pr.step.stages[s];
    std::map<std::string, double> phase;
    const std::vector<std::pair<double, double>> waits = blocked(st.comms);
    for (const prof::Span& sp : st.spans) phase[prof::phase_name(sp.phase)] += compute_in(sp.start, sp.end, waits);
    std::string phases;
    for (const char* name : {"forward", "backward", "backward_input", "backward_weight", "optimizer"})
      if (phase.count(name)) phases += fmt::format("{}{} {:.2f}", phases.empty() ? "" : ", ", name, ms * phase[name]);
    std::vector<int> stage_ranks;
    for (int r = 0; r < l.world(); ++r)
      if (mesh::coord(l, r, "pp") == int(s)) stage_ranks.push_back(r);
    fmt::print("  stage {} (ranks {}): compute ms {}{} | bubble {:.1f}% | exposed comm {:.2f} ms\n", s,
               rank_ranges(stage_ranks), phases,
               st.slowed > 0 ? fmt::format(" (of which {:.2f} slowed by communication beside it)", ms * st.slowed) : "",
               100 * pr.bubbles[s].idle_over_step, ms * st.comm_wait);
    // (axis, op) in order of first use.
    std::vector<std::pair<std::string, std::string>> order;
    // calls, transfer, exposed, span, waiting for the group (blocked beyond the transfer)
    std::map<std::pair<std::string, std::string>, std::array<double, 5>> by;
    for (const comm::CommRecord& c : st.comms) {
      const auto key = std::make_pair(c.axis, c.op);
      if (!by.count(key)) order.push_back(key);
      auto& f = by[key];
      const double transfer = c.transfer_end - c.transfer_start;
      f[0] += 1, f[1] += transfer, f[2] += c.wait, f[3] += c.end - c.start, f[4] += std::max(0.0, c.wait - transfer);
    }
    for (const auto& key : order) {
      const auto& f = by[key];
      fmt::print("      {:<5} {:<15} {:>5} calls  transfer {:>8.2f} ms  exposed {:>8.2f} ms (waiting for the group "
                 "{:>8.2f})  hidden {:>4.0f}%\n",
                 key.first, key.second, f[0], ms * f[1], ms * f[2], ms * f[4],
                 f[3] > 0 ? 100 * std::max(0.0, 1 - f[2] / f[3]) : 0);
      const std::string what = key.first + " " + key.second;
      auto it = std::find_if(causes.begin(), causes.end(), [&](const Cause& c) { return c.what == what; });
      if (it == causes.end()) causes.push_back({f[2], s, what});
      else if (f[2] > it->exposed) *it = {f[2], s, what};
    }
  }
  // Each axis and op once, at the stage where it exposes the most.
  std::stable_sort(causes.begin(), causes.end(), [](const Cause& a, const Cause& b) { return a.exposed > b.exposed; });
  if (!causes.empty() && causes.front().exposed > 0) {
    fmt::print("largest causes of exposed time (each at the stage where it exposes the most):");
    for (std::size_t i = 0; i < std::min<std::size_t>(3, causes.size()) && causes[i].exposed > 0; ++i)
      fmt::print("{} {}. {} on stage {}: {:.2f} ms ({:.0f}% of the step){}", i ? ";" : "", i + 1, causes[i].what,
                 causes[i].stage, ms * causes[i].exposed, 100 * causes[i].exposed / pr.step.step_time,
                 causes[i].what == "pp recv" ? ", the pipeline's wait for the neighbouring stage" : "");
    fmt::print("\n");
  }
}

}  // namespace

int simulate_deck(const deck::Deck& deck, const SimulateOptions& o) {
  const plan::Plan& cfg = deck.config;
  sim::Machine machine = sim::load_machine(o.machine);
  const mesh::Layout l = strategies::layout_of(cfg);
  const report::ReportPath report = report::choose_report_path(o.output, "results/" + cfg.run.name + "-sim.h5", o.force,
                                                               "report", run_inputs(deck, "", machine.path));
  if (!report.problem.empty()) core::input_error("report path {}: {}", report.path, report.problem);
  if (!report.note.empty()) fmt::print("{}\n", report.note);
  const std::string& path = report.path;
  const Prediction pr = predict(cfg, machine);
  const Fit fit = fit_of(cfg, machine, pr);
  write_report(deck, o, machine, pr, fit, path);
  const int status = fit.does_not_fit.empty() ? 0 : 3;
  if (o.quiet) return status;

  fmt::print("strata simulate | {} | machine {} ({} device(s) per node) | {} rank(s): {} | {}\n", deck.path,
             machine.name, machine.devices_per_node, l.world(), mesh::describe(l),
             core::precision_name(cfg.backend.precision));
  // A CPU's figures are GFLOP/s: in TFLOP/s they would print as 0.0.
  const double model_rate = pr.step.step_time > 0 ? pr.model_flops / pr.step.step_time / l.world() : 0;
  const double hardware_rate = pr.step.step_time > 0 ? pr.hardware_flops / pr.step.step_time / l.world() : 0;
  const bool tera = std::max(model_rate, hardware_rate) >= 1e12;
  fmt::print("predicted step {:.4f} s | {:.0f} tokens/s | MFU {:.1f}% | HFU {:.1f}% | {:.1f} {}FLOP/s per device "
             "(model), {:.1f} (hardware)\n",
             pr.step.step_time, pr.tokens_per_s, 100 * pr.mfu, 100 * pr.hfu, model_rate / (tera ? 1e12 : 1e9),
             tera ? "T" : "G", hardware_rate / (tera ? 1e12 : 1e9));
  fmt::print("  {:>5} {:>6} {:>12} {:>12} {:>12} {:>8} {:>12}\n", "stage", "rank", "compute_s", "exposed_comm_s",
             "end_s", "bubble", "device_peak");
  for (std::size_t s = 0; s < pr.step.stages.size(); ++s) {
    const auto& st = pr.step.stages[s];
    std::uint64_t peak = 0;
    for (const RankClass& k : pr.estimate.classes)
      if (std::find(k.ranks.begin(), k.ranks.end(), st.rank) != k.ranks.end())
        peak = k.memory[core::Pool::device].total_peak;
    fmt::print("  {:>5} {:>6} {:>12.4f} {:>12.4f} {:>12.4f} {:>8.3f} {:>12}\n", s, st.rank, st.compute, st.comm_wait,
               st.end, pr.bubbles[s].idle_over_step, core::format_bytes(double(peak)));
  }
  print_breakdown(pr, l);
  if (pr.step.stages.size() > 1) {
    fmt::print("bubble per stage beside the {} schedule's theory {} = {:.1f}% (p {}, m {}, v {}), and where the "
               "difference comes from (replayed with communication free, then with only the pipeline's calls "
               "priced):\n",
               cfg.parallel.schedule->name, cfg.parallel.schedule->formula, 100 * pr.bubbles[0].theory,
               pr.step.stages.size(), cfg.micro_batches(), cfg.parallel.virtual_stages);
    const std::vector<BubbleCauses> why = explain_bubbles(cfg, machine, pr);
    for (std::size_t s = 0; s < why.size(); ++s)
      fmt::print("  stage {}: bubble {:5.1f}% = theory {:.1f}% {:+.1f}% the stages' work (waiting for a neighbour's "
                 "compute) {:+.1f}% work outside the schedule's actions {:+.1f}% pipeline transfers {:+.1f}% other "
                 "axes' calls\n",
                 s, 100 * why[s].bubble, 100 * why[s].theory, 100 * why[s].stages_work, 100 * why[s].outside,
                 100 * why[s].transfers, 100 * why[s].other_axes);
  }
  fmt::print("report: {}\n", path);
  // Last, where it cannot be missed, and as the dry run says it: exit
  // status 3 when a rank's peak exceeds a device.
  for (const std::string& line : fit.does_not_fit) fmt::print("DOES NOT FIT: {}\n", line);
  if (fit.capacity != 0 && fit.does_not_fit.empty())
    fmt::print("fits: every rank's device peak is within {} per device\n", core::format_bytes(double(fit.capacity)));
  return status;
}

}  // namespace strata::train
