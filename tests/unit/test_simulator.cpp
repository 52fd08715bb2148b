// The step simulator (src/sim/simulator.hpp) and machine descriptions
// (src/sim/machine.hpp): the timing rules each against its formula; the
// discrete-event executor against the unit-cost pipeline executor it grew
// from, on every schedule; a dry run's trace against the meta device's own
// counts; a whole deck's prediction holding the estimate's memory; and every
// kind of bad machine description named with file, line and key.
#include <gtest/gtest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <numeric>

#include "kernels/foundation/error.hpp"
#include "src/deck/deck.hpp"
#include "src/sim/calibrate.hpp"
#include "src/sim/machine.hpp"
#include "src/sim/pipeline_sim.hpp"
#include "src/sim/simulator.hpp"
#include "strategies/registry.hpp"
#include "src/train/estimate.hpp"
#include "src/train/search.hpp"
#include "src/train/simulate.hpp"
#include "strategies/pp/schedule.hpp"
#include "tests/unit/sim_test_support.hpp"

using namespace strata;

namespace {

// The mesh of pp x dp ranks, as the registry's rows declare it.
mesh::Layout grid(int pp, int dp) {
  plan::Plan q;
  q.parallel.pp = pp, q.parallel.dp = dp;
  return strategies::layout_of(q);
}

}  // namespace

namespace {

using test::kMachine;
using test::unit_machine;

std::string input_error_of(const std::string& text) {
  try {
    sim::parse_machine("m.toml", text);
  } catch (const core::Error& e) {
    EXPECT_EQ(e.kind(), core::ErrorKind::input);
    EXPECT_EQ(e.exit_code(), 2);
    return e.what();
  }
  return "";
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  const auto at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

}  // namespace

TEST(Machine, ParsesEveryFigureInSIUnits) {
  const sim::Machine m = unit_machine();
  EXPECT_EQ(m.name, "unit");
  EXPECT_EQ(m.devices_per_node, 4);
  EXPECT_TRUE(m.gpu);
  EXPECT_DOUBLE_EQ(m.memory, 16.0 * (1ull << 30));
  EXPECT_DOUBLE_EQ(m.peak(core::Precision::bf16), 100e12);
  EXPECT_DOUBLE_EQ(m.peak(core::Precision::fp32), 10e12);
  EXPECT_DOUBLE_EQ(m.launch_latency, 2e-6);
  EXPECT_DOUBLE_EQ(m.cluster.bandwidth, 40e9);
}

TEST(Machine, BadFiguresNameFileLineAndKey) {
  EXPECT_NE(input_error_of(replace(kMachine, "memory_bandwidth_gbs = 1000\n", "")).find("device.memory_bandwidth_gbs is missing"),
            std::string::npos);
  const std::string neg = input_error_of(replace(kMachine, "launch_latency_us = 2", "launch_latency_us = -2"));
  EXPECT_NE(neg.find("m.toml:14: device.launch_latency_us must be >= 0"), std::string::npos) << neg;
  const std::string zero = input_error_of(replace(kMachine, "peak_tflops_bf16 = 100", "peak_tflops_bf16 = 0"));
  EXPECT_NE(zero.find("m.toml:8: device.peak_tflops_bf16 must be > 0"), std::string::npos) << zero;
  const std::string kind = input_error_of(replace(kMachine, "kind = \"gpu\"", "kind = \"tpu\""));
  EXPECT_NE(kind.find("device.kind must be one of \"gpu\", \"cpu\""), std::string::npos) << kind;
  EXPECT_NE(input_error_of(replace(kMachine, "[network.node]", "[network.nodes]")).find("unknown key network.nodes"),
            std::string::npos);
  EXPECT_NE(input_error_of("name = \n").find("TOML syntax error"), std::string::npos);
  const std::string typo = input_error_of(replace(kMachine, "host_link_gbs = 20", "host_lnk_gbs = 20"));
  EXPECT_NE(typo.find("m.toml:15: unknown key device.host_lnk_gbs; known there: kind, memory_gib"), std::string::npos)
      << typo;
  const std::string half = input_error_of(replace(kMachine, "devices_per_node = 4", "devices_per_node = 2.5"));
  EXPECT_NE(half.find("m.toml:2: devices_per_node must be a whole number"), std::string::npos) << half;
}

// What calibrate will not let pass without a word: each kind of doubtful
// figure is named with what to do, and a sound description has none.
TEST(Calibrate, NamesEveryFigureNotToBeTrusted) {
  sim::Machine m;
  m.memory_bandwidth = 10e9;
  m.fits.push_back({"node", "all_reduce", 2, 5e-6, 4e9, 0.05, false, {}, {}});
  EXPECT_TRUE(sim::trust_problems(m, {{"the memory bandwidth", 0.1}}, 1.0, 8, 2).empty());
  // Faster than memory, slow to start, not a line, repeats apart, a busy node.
  m.fits.push_back({"node", "all_gather", 4, 2e-3, 40e9, 0.7, true, {}, {}});
  m.fits.push_back({"cluster", "all_reduce", 16, 2e-3, 40e9, 0.1, false, {}, {}});
  const auto p = sim::trust_problems(
      m, {{"the memory bandwidth", 0.1}, {"the 64x64x64 product", 0.6}, {"all_reduce of 4096 B", 0.3}}, 9.0, 8, 2);
  const std::string all = fmt::format("{}", fmt::join(p, "\n"));
  ASSERT_EQ(p.size(), 5u) << all;
  EXPECT_NE(all.find("the node was busy: a load average of 9.0 on 8 core(s) besides this job's 2 thread(s)"),
            std::string::npos) << all;
  EXPECT_NE(all.find("2 of 3 measurement(s) spread beyond 25% over three rounds of repeats (the widest: the 64x64x64 "
                     "product, 60%)"), std::string::npos) << all;
  EXPECT_NE(all.find("node non-blocking all_gather of 4 rank(s): 40.000 GB/s of bus bandwidth, above the memory's "
                     "10.000 GB/s"), std::string::npos) << all;
  EXPECT_NE(all.find("node non-blocking all_gather of 4 rank(s): a latency of 2000 us"), std::string::npos) << all;
  EXPECT_NE(all.find("the fit's residual is 70%"), std::string::npos) << all;
  // Across nodes a bus bandwidth above one node's memory is no contradiction,
  // nor is a latency of milliseconds.
  EXPECT_EQ(all.find("cluster"), std::string::npos) << all;
}

TEST(Machine, ReadsAFitsMeasuredTimesAndRefusesBadOnes) {
  const std::string fit = "\n[[network.fit]]\nlevel = \"node\"\nop = \"all_gather\"\ngroup_size = 2\nlatency_us = 1\n"
                          "bandwidth_gbs = 5\nbytes = [4096, 65536]\ntime_us = [2.5, 30]\n";
  const sim::Machine m = sim::parse_machine("m.toml", kMachine + fit);
  ASSERT_EQ(m.fits.size(), 1u);
  EXPECT_EQ(m.fits[0].bytes, (std::vector<double>{4096, 65536}));
  EXPECT_EQ(m.fits[0].seconds, (std::vector<double>{2.5e-6, 30e-6}));
  const std::string uneven = input_error_of(kMachine + replace(fit, "[2.5, 30]", "[2.5]"));
  EXPECT_NE(uneven.find("network.fit[0] has 2 sizes (bytes) and 1 times (time_us)"), std::string::npos) << uneven;
  const std::string order = input_error_of(kMachine + replace(fit, "[4096, 65536]", "[65536, 4096]"));
  EXPECT_NE(order.find("network.fit[0].bytes must increase"), std::string::npos) << order;
  const std::string bad = input_error_of(kMachine + replace(fit, "[2.5, 30]", "[2.5, nan]"));
  EXPECT_NE(bad.find("network.fit[0].time_us must hold numbers in [0, 1e+09]"), std::string::npos) << bad;
}

TEST(Machine, ComputeSlowdownIsOneUnlessGivenAndNeverBelow) {
  EXPECT_DOUBLE_EQ(unit_machine().compute_slowdown, 1.0);
  const std::string with = replace(kMachine, "overlap = 1.0\n", "overlap = 1.0\ncompute_slowdown = 1.19\n");
  EXPECT_DOUBLE_EQ(sim::parse_machine("m.toml", with).compute_slowdown, 1.19);
  const std::string below = input_error_of(replace(with, "1.19", "0.9"));
  EXPECT_NE(below.find("m.toml:"), std::string::npos) << below;
  EXPECT_NE(below.find("network.compute_slowdown must be from 1"), std::string::npos) << below;
}

TEST(Machine, UnknownNameListsTheKnownOnes) {
  try {
    sim::load_machine("no-such-machine");
    FAIL() << "loaded a machine that does not exist";
  } catch (const core::Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    const std::string what = e.what();
    EXPECT_NE(what.find("a100-80gb"), std::string::npos) << what;
    EXPECT_NE(what.find("h100-80gb"), std::string::npos) << what;
    EXPECT_NE(what.find("h200"), std::string::npos) << what;
  }
  for (const char* name : {"a100-80gb", "h100-80gb", "h200"}) EXPECT_EQ(sim::load_machine(name).name, name);
}

TEST(Simulator, KernelTimeIsTheRooflineWithShapeEfficiency) {
  const sim::Machine m = unit_machine();
  prof::TraceEvent gemm;
  gemm.name = "matmul";
  gemm.matmul_flops = 2.0 * 64 * 128 * 256;
  gemm.m = 64, gemm.n = 128, gemm.k = 256, gemm.bytes = 1;
  // d = 64 = half_dim: half of matmul_efficiency x peak.
  EXPECT_DOUBLE_EQ(sim::kernel_time(m, gemm, core::Precision::bf16), 2e-6 + gemm.matmul_flops / (100e12 * 0.25));
  prof::TraceEvent stream;
  stream.name = "add_inplace";
  stream.other_flops = 1e6, stream.bytes = 12e6;  // memory-bound: 12 us beside 0.2 us of arithmetic
  EXPECT_DOUBLE_EQ(sim::kernel_time(m, stream, core::Precision::fp32), 2e-6 + 12e-6);
  sim::Machine f = m;
  f.kernel_factors["add_inplace"] = 1.5;
  EXPECT_DOUBLE_EQ(sim::kernel_time(f, stream, core::Precision::fp32), 2e-6 + 18e-6);
}

TEST(Simulator, CollectivesByRingStepsBusFactorAndLevel) {
  const sim::Machine m = unit_machine();
  const double B = 8e6;
  // Inside a node: 2(n-1) steps, 2(n-1)/n bytes per byte.
  EXPECT_DOUBLE_EQ(sim::comm_time(m, "all_reduce", {0, 1, 2, 3}, B), 6 * 3e-6 + B * 1.5 / 100e9);
  EXPECT_DOUBLE_EQ(sim::comm_time(m, "all_gather", {0, 1}, B), 1 * 3e-6 + B * 0.5 / 100e9);
  // One rank per node (a dp group beside tp 4): a quarter of the node's NICs.
  EXPECT_DOUBLE_EQ(sim::comm_time(m, "all_reduce", {0, 4}, B), 2 * 7e-6 + B * 1.0 / 10e9);
  // Four per node: all of them, though never more than inside the node.
  EXPECT_DOUBLE_EQ(sim::comm_time(m, "reduce_scatter", {0, 1, 2, 3, 4, 5, 6, 7}, B), 7 * 7e-6 + B * 7 / 8 / 40e9);
  EXPECT_DOUBLE_EQ(sim::comm_time(m, "send", {3, 4}, B), 7e-6 + B / 10e9);
  EXPECT_EQ(sim::comm_time(m, "all_reduce", {5}, B), 0.0);
  // A calibrated fit for the op and size wins.
  sim::Machine f = m;
  f.fits.push_back({"node", "all_reduce", 2, 1e-6, 5e9, 0.01, false, {}, {}});
  EXPECT_DOUBLE_EQ(sim::comm_time(f, "all_reduce", {0, 1}, B), 1e-6 + B * 1.0 / 5e9);
  EXPECT_DOUBLE_EQ(sim::comm_time(f, "all_reduce", {0, 1}, B, true), 1e-6 + B * 1.0 / 5e9);  // the only fit
  // The non-blocking form's own fit, for non-blocking calls only.
  f.fits.push_back({"node", "all_reduce", 2, 4e-6, 1e9, 0.02, true, {}, {}});
  EXPECT_DOUBLE_EQ(sim::comm_time(f, "all_reduce", {0, 1}, B, true), 4e-6 + B * 1.0 / 1e9);
  EXPECT_DOUBLE_EQ(sim::comm_time(f, "all_reduce", {0, 1}, B), 1e-6 + B * 1.0 / 5e9);
  // With the times it was fitted to: those, and straight lines between
  // them, inside the sizes measured; the fitted line outside.
  sim::Machine g = m;
  g.fits.push_back({"node", "reduce_scatter", 2, 2e-6, 4e9, 0.25, false, {4096, 65536, 262144}, {3e-6, 20e-6, 50e-6}});
  EXPECT_DOUBLE_EQ(sim::comm_time(g, "reduce_scatter", {0, 1}, 4096), 3e-6);
  EXPECT_DOUBLE_EQ(sim::comm_time(g, "reduce_scatter", {0, 1}, 65536), 20e-6);
  EXPECT_DOUBLE_EQ(sim::comm_time(g, "reduce_scatter", {0, 1}, 262144), 50e-6);
  EXPECT_DOUBLE_EQ(sim::comm_time(g, "reduce_scatter", {0, 1}, 163840), 35e-6);
  EXPECT_DOUBLE_EQ(sim::comm_time(g, "reduce_scatter", {0, 1}, 1024), 2e-6 + 1024 * 0.5 / 4e9);
  EXPECT_DOUBLE_EQ(sim::comm_time(g, "reduce_scatter", {0, 1}, B), 2e-6 + B * 0.5 / 4e9);
}

namespace {

// A pipeline schedule's action lists as traces: every compute action one
// kernel of the given seconds (the machine's launch latency, nothing else),
// sends and receives as the executor issues them.
std::vector<prof::Trace> schedule_traces(const strategies::pp::Schedule& sched) {
  using strategies::pp::Op;
  std::vector<prof::Trace> out(sched.size());
  for (std::size_t r = 0; r < sched.size(); ++r) {
    for (const auto& a : sched[r]) {
      prof::TraceEvent e;
      if (a.op == Op::send_act || a.op == Op::send_grad || a.op == Op::recv_act || a.op == Op::recv_grad) {
        const bool send = a.op == Op::send_act || a.op == Op::send_grad;
        const int tag = (a.op == Op::send_grad || a.op == Op::recv_grad) ? 2 : 1;
        out[r].comms.push_back({send ? "send" : "recv", "pp", int(sched.size()), int(r), 64, a.peer, tag, send});
        e.kind = prof::TraceEvent::Kind::comm;
        e.comm = int(out[r].comms.size()) - 1;
        out[r].events.push_back(e);
        continue;
      }
      if (a.op != Op::forward && a.op != Op::backward && a.op != Op::backward_input && a.op != Op::backward_weight)
        continue;
      e.kind = prof::TraceEvent::Kind::kernel;
      e.name = "unit";
      const int n = a.op == Op::backward ? 2 : 1;  // the unit costs: forward 1, backward 2, halves 1
      for (int i = 0; i < n; ++i) out[r].events.push_back(e);
    }
  }
  return out;
}

}  // namespace

TEST(Simulator, ReplaysEverySchedulesListAsTheUnitCostExecutorDoes) {
  sim::Machine m = unit_machine();
  m.launch_latency = 1;  // a kernel of no work takes one unit
  m.node.latency = 0, m.node.bandwidth = 1e30;
  m.cluster = m.node;
  for (const auto& row : strategies::pp::schedules()) {
    for (int p : {2, 3, 4}) {
      const int v = row.virtual_stages ? 2 : 1;  // two chunks for the schedules that run several
      const strategies::pp::Shape shape{p, 2 * p, v};
      const auto sched = strategies::pp::make_schedule(row, shape);
      const auto traces = schedule_traces(sched);
      std::vector<const prof::Trace*> ptrs;
      for (const auto& t : traces) ptrs.push_back(&t);
      const mesh::Layout l = grid(p, 1);
      const sim::StepSimulation s = sim::simulate_step(l, ptrs, m, core::Precision::fp32);
      const sim::PipelineRun unit = sim::simulate(sched);
      EXPECT_DOUBLE_EQ(s.step_time, unit.makespan) << row.name << " p " << p;
      for (int r = 0; r < p; ++r) EXPECT_DOUBLE_EQ(s.stages[r].end, unit.ranks[r].end) << row.name << " rank " << r;
    }
  }
}

namespace {

// One stage: a non-blocking all-reduce on dp, 3 kernels, then its wait.
prof::Trace reduce_beside_three_kernels() {
  prof::Trace t;
  t.comms.push_back({"all_reduce", "dp", 2, 0, 0, -1, 0, true});
  prof::TraceEvent c;
  c.kind = prof::TraceEvent::Kind::comm, c.comm = 0;
  t.events.push_back(c);
  prof::TraceEvent k;
  k.kind = prof::TraceEvent::Kind::kernel, k.name = "unit";
  for (int i = 0; i < 3; ++i) t.events.push_back(k);
  prof::TraceEvent w;
  w.kind = prof::TraceEvent::Kind::wait, w.comm = 0;
  t.events.push_back(w);
  return t;
}

// The unit machine where a kernel of no work takes 1 and an all-reduce of
// two ranks 2 (2(n - 1) ring steps of 1, bandwidth unbounded).
sim::Machine unit_steps() {
  sim::Machine m = unit_machine();
  m.launch_latency = 1;
  m.node.latency = 1, m.node.bandwidth = 1e30;
  return m;
}

}  // namespace

TEST(Simulator, NonBlockingCallsOverlapByTheMachinesShare) {
  // An all-reduce of 2 units beside 3 units of kernels.
  const prof::Trace t = reduce_beside_three_kernels();
  sim::Machine m = unit_steps();
  const mesh::Layout l = grid(1, 2);
  for (double share : {1.0, 0.5, 0.0}) {
    m.overlap = share;
    const auto s = sim::simulate_step(l, {&t}, m, core::Precision::fp32);
    // 3 units of compute, plus what of the 2 units was not done meanwhile.
    EXPECT_DOUBLE_EQ(s.step_time, 3 + std::max(0.0, 2 - share * 3)) << share;
    EXPECT_DOUBLE_EQ(s.stages[0].comm_wait, std::max(0.0, 2 - share * 3)) << share;
  }
}

// Machine::compute_slowdown: kernels run slower while a call moves beside
// them, in proportion to the rate it moves at, and at their own pace once it
// is done.
TEST(Simulator, KernelsSlowWhileACallMovesBesideThem) {
  // An all-reduce of 2 units beside 3 kernels of 1 unit.
  const prof::Trace t = reduce_beside_three_kernels();
  sim::Machine m = unit_steps();
  m.compute_slowdown = 1.5;
  const mesh::Layout l = grid(1, 2);
  // Share 1: moving for 2 units, in which 2 / 1.5 of the work is done.
  m.overlap = 1;
  auto s = sim::simulate_step(l, {&t}, m, core::Precision::fp32);
  EXPECT_NEAR(s.step_time, 2 + (3 - 2 / 1.5), 1e-12);
  EXPECT_NEAR(s.stages[0].slowed, s.step_time - 3, 1e-12);
  EXPECT_NEAR(s.stages[0].comm_wait, 0, 1e-12);
  // Share 0.5: moving at half the rate slows the kernels half as
  // much (1.25): their 3 units take 3.75, by when 1.875 of its 2 units are
  // done; the wait moves the rest at the full rate.
  m.overlap = 0.5;
  s = sim::simulate_step(l, {&t}, m, core::Precision::fp32);
  EXPECT_NEAR(s.step_time, 3.75 + (2 - 0.5 * 3.75), 1e-12);
  EXPECT_NEAR(s.stages[0].slowed, 0.75, 1e-12);
  EXPECT_NEAR(s.stages[0].comm_wait, 2 - 0.5 * 3.75, 1e-12);
  // Share 0: nothing moves beside the kernels, nothing slows them.
  m.overlap = 0;
  s = sim::simulate_step(l, {&t}, m, core::Precision::fp32);
  EXPECT_NEAR(s.step_time, 3 + 2, 1e-12);
  EXPECT_NEAR(s.stages[0].slowed, 0, 1e-12);
}

TEST(Simulator, CallsOnOneAxisRunOneAfterAnother) {
  // Two non-blocking all-reduces of 2 units each, 4 units of kernels, then both waits:
  // at share 0.5 the first is done by 4, the second starts then and, waited at once, takes 2 more.
  prof::Trace t;
  for (int i = 0; i < 2; ++i) {
    t.comms.push_back({"all_reduce", "dp", 2, 0, 0, -1, 0, true});
    prof::TraceEvent c;
    c.kind = prof::TraceEvent::Kind::comm, c.comm = i;
    t.events.push_back(c);
  }
  prof::TraceEvent k;
  k.kind = prof::TraceEvent::Kind::kernel, k.name = "unit";
  for (int i = 0; i < 4; ++i) t.events.push_back(k);
  for (int i = 0; i < 2; ++i) {
    prof::TraceEvent w;
    w.kind = prof::TraceEvent::Kind::wait, w.comm = i;
    t.events.push_back(w);
  }
  sim::Machine m = unit_machine();
  m.launch_latency = 1;
  m.node.latency = 1, m.node.bandwidth = 1e30;
  m.overlap = 0.5;
  const mesh::Layout l = grid(1, 2);
  const auto s = sim::simulate_step(l, {&t}, m, core::Precision::fp32);
  EXPECT_DOUBLE_EQ(s.step_time, 6.0);
  EXPECT_DOUBLE_EQ(s.stages[0].comms[0].end, 4.0);
  EXPECT_DOUBLE_EQ(s.stages[0].comms[1].end, 6.0);
}

using test::tiny;

TEST(Simulator, TheTraceIsTheMetaDevicesOwnCount) {
  for (const auto& sets : std::vector<std::vector<std::string>>{
           {"parallel.dp=2"}, {"parallel.dp=2", "parallel.zero=2"}, {"parallel.dp=2", "parallel.zero=3"}, {"parallel.tp=2", "parallel.pp=2"}, {"model.recompute=\"full\""}}) {
    const plan::Plan cfg = tiny(sets);
    std::vector<train::CommVolume> comm;
    std::vector<kernels::WorkCost> work;
    prof::Trace trace;
    train::estimate_rank(cfg, 0, &comm, &work, &trace);
    double mm = 0, other = 0, bytes = 0, traced_mm = 0, traced_other = 0, traced_bytes = 0;
    for (const auto& w : work) mm += w.matmul_flops, other += w.other_flops, bytes += w.bytes;
    std::int64_t calls = 0;
    for (const auto& c : comm) calls += c.calls;
    int spans = 0;
    for (const auto& e : trace.events) {
      if (e.kind == prof::TraceEvent::Kind::kernel)
        traced_mm += e.matmul_flops, traced_other += e.other_flops, traced_bytes += e.bytes;
      spans += e.kind == prof::TraceEvent::Kind::span_begin ? 1 : e.kind == prof::TraceEvent::Kind::span_end ? -1 : 0;
    }
    EXPECT_DOUBLE_EQ(traced_mm, mm);
    EXPECT_DOUBLE_EQ(traced_other, other);
    EXPECT_DOUBLE_EQ(traced_bytes, bytes);
    EXPECT_EQ(std::int64_t(trace.comms.size()), calls);
    EXPECT_EQ(spans, 0);  // every span that begins ends
    // Every non-blocking collective is waited for (a test that finds it done does not end it).
    std::vector<int> waited(trace.comms.size(), 0);
    for (const auto& e : trace.events)
      if (e.kind == prof::TraceEvent::Kind::wait) ++waited[std::size_t(e.comm)];
    for (std::size_t i = 0; i < trace.comms.size(); ++i) {
      if (trace.comms[i].nonblocking && trace.comms[i].op != "send" && trace.comms[i].op != "recv") {
        EXPECT_EQ(waited[i], 1) << trace.comms[i].axis << " " << trace.comms[i].op;
      }
    }
  }
}

TEST(Simulator, APredictionHoldsTheEstimatesMemoryAndItsSchedulesBubble) {
  const sim::Machine m = unit_machine();
  const plan::Plan cfg = tiny({"parallel.pp=2", "parallel.dp=2", "parallel.zero=1"});
  const train::Prediction pr = train::predict(cfg, m);
  const train::Estimate e = train::estimate(cfg);
  ASSERT_EQ(pr.estimate.classes.size(), e.classes.size());
  for (std::size_t i = 0; i < e.classes.size(); ++i) {
    EXPECT_EQ(pr.estimate.classes[i].ranks, e.classes[i].ranks);
    EXPECT_TRUE(pr.estimate.classes[i].memory == e.classes[i].memory);
  }
  ASSERT_EQ(pr.step.stages.size(), 2u);
  EXPECT_GT(pr.step.step_time, 0);
  // A step is at least each stage's compute, and a pipeline idles somewhere.
  for (const auto& s : pr.step.stages) EXPECT_GE(pr.step.step_time, s.compute);
  EXPECT_GT(pr.bubbles[0].idle_over_step + pr.bubbles[1].idle_over_step, 0.0);
  EXPECT_NEAR(pr.tokens_per_s, 8.0 * 8 / pr.step.step_time, 1e-9 * pr.tokens_per_s);
}

// parallel.overlap_grad_reduce = false issues the same reductions after the
// backward pass: on a machine whose links overlap compute fully, the step is
// longer by what no longer hides, and all of it is exposed.
TEST(Simulator, ReductionsAfterTheBackwardPassHideNothing) {
  const sim::Machine m = unit_machine();
  for (const auto& sets : std::vector<std::vector<std::string>>{{"parallel.dp=2", "parallel.bucket_mb=0.001"},
                                                                {"parallel.dp=2", "parallel.zero=2"}}) {
    SCOPED_TRACE(sets.back());
    std::vector<std::string> off = sets;
    off.push_back("parallel.overlap_grad_reduce=false");
    const train::Prediction a = train::predict(tiny(sets), m), b = train::predict(tiny(off), m);
    EXPECT_GT(b.step.step_time, a.step.step_time);
    EXPECT_GT(b.step.stages[0].comm_wait, a.step.stages[0].comm_wait);
    // The same compute either way.
    EXPECT_DOUBLE_EQ(b.step.stages[0].compute, a.step.stages[0].compute);
  }
}

// The planner simulates a layout of many micro-batches at two small counts
// and extends the line (train::plan_figures): under every schedule, with
// sharded state and with tp x pp x dp, its figures are the whole
// simulation's.
TEST(Plan, ManyMicroBatchesLieOnTheLineOfTwoFew) {
  const sim::Machine m = unit_machine();
  const std::vector<std::vector<std::string>> layouts = {
      {"parallel.dp=2", "parallel.zero=2", "data.global_batch=48"},
      {"parallel.dp=2", "parallel.zero=3", "data.global_batch=48"},
      {"parallel.pp=2", "data.global_batch=24"},
      {"parallel.pp=2", "parallel.schedule=\"gpipe\"", "data.global_batch=24"},
      {"parallel.pp=2", "parallel.schedule=\"interleaved\"", "parallel.virtual_stages=2", "model.layers=4",
       "data.global_batch=24"},
      {"parallel.pp=2", "parallel.schedule=\"zb-h1\"", "data.global_batch=24"},
      {"parallel.pp=2", "parallel.schedule=\"zb-v\"", "parallel.virtual_stages=2", "model.layers=4",
       "data.global_batch=24"},
      {"parallel.tp=2", "parallel.pp=2", "parallel.dp=2", "parallel.zero=1", "data.global_batch=48"}};
  for (const auto& sets : layouts) {
    SCOPED_TRACE(fmt::format("{}", fmt::join(sets, " ")));
    const plan::Plan cfg = tiny(sets);
    const train::Figures f = train::plan_figures(cfg, m);
    const train::Prediction whole = train::predict(cfg, m);
    EXPECT_EQ(f.micro_batches, 12);
    EXPECT_LT(f.simulated, f.micro_batches);
    EXPECT_NEAR(f.step_time, whole.step.step_time, 1e-9 * whole.step.step_time);
    EXPECT_NEAR(f.tokens_per_s, whole.tokens_per_s, 1e-9 * whole.tokens_per_s);
    EXPECT_NEAR(f.mfu, whole.mfu, 1e-9 * whole.mfu);
    double peak = 0, bubble = 0, exposed = 0;
    for (const auto& k : whole.estimate.classes) peak = std::max(peak, double(k.memory[core::Pool::device].total_peak));
    for (const auto& b : whole.bubbles) bubble = std::max(bubble, b.idle_over_step);
    for (const auto& s : whole.step.stages) exposed = std::max(exposed, s.comm_wait);
    EXPECT_NEAR(f.peak_bytes, peak, 0.5);
    EXPECT_NEAR(f.bubble, bubble, 1e-9);
    EXPECT_NEAR(f.exposed_comm, exposed, 1e-9 * whole.step.step_time);
  }
}

TEST(Simulator, OffloadRunsOnTheHostAndItsLinks) {
  const sim::Machine m = unit_machine();
  prof::TraceEvent update;
  update.name = "adamw_update";
  update.other_flops = 14e6, update.bytes = 28e6;
  // On the device: memory-bound at 1000 GB/s; offloaded: at the host's 50 GB/s, no launch.
  EXPECT_DOUBLE_EQ(sim::kernel_time(m, update, core::Precision::fp32), 2e-6 + 28e6 / 1000e9);
  update.host = true;
  EXPECT_DOUBLE_EQ(sim::kernel_time(m, update, core::Precision::fp32), 28e6 / 50e9);
  EXPECT_DOUBLE_EQ(sim::transfer_time(m, "host", 40e6), 40e6 / 20e9);
  sim::Machine no_nvme = m;
  no_nvme.nvme_bandwidth = 0;
  EXPECT_THROW(sim::transfer_time(no_nvme, "nvme", 1), core::Error);
  // A deck with host offload: its update is traced as host work, its copies as transfers.
  const plan::Plan cfg = tiny({"parallel.offload=\"host\""});
  prof::Trace trace;
  train::estimate_rank(cfg, 0, nullptr, nullptr, &trace);
  int host_kernels = 0, copies = 0;
  for (const auto& e : trace.events) host_kernels += e.kind == prof::TraceEvent::Kind::kernel && e.host;
  for (const auto& c : trace.comms) copies += c.axis == "host";
  EXPECT_GT(host_kernels, 0);
  EXPECT_EQ(copies, 2);  // gradients (and fp32 parameters) to the host, parameters back
}

// simulate's attribution of each stage's bubble. Its parts are differences
// of replays, so they add up by construction (checked all the same); what
// is tested is that each lands where its cause is: with links that take no
// time nothing on transfers or other axes, and slower links put their cost
// there, not on the stages' work, which is the theory's own formula plus
// the same amount whatever the links.
TEST(Simulator, ABubblesCausesAddUpToIt) {
  const plan::Plan cfg = tiny({"parallel.pp=2", "parallel.dp=2", "parallel.tp=2", "parallel.zero=1", "model.layers=4",
                               "parallel.schedule=\"interleaved\"", "parallel.virtual_stages=2",
                               "data.global_batch=16", "data.micro_batch=1"});
  sim::Machine fast = unit_machine();
  fast.node.latency = fast.cluster.latency = 0;
  fast.node.bandwidth = fast.cluster.bandwidth = 1e30;
  sim::Machine slow = unit_machine();
  slow.node.bandwidth /= 1000, slow.cluster.bandwidth /= 1000;
  const train::Prediction a = train::predict(cfg, fast), b = train::predict(cfg, slow);
  const auto ca = train::explain_bubbles(cfg, fast, a), cb = train::explain_bubbles(cfg, slow, b);
  ASSERT_EQ(ca.size(), 2u);
  for (std::size_t s = 0; s < 2; ++s) {
    for (const auto& c : {ca[s], cb[s]})
      EXPECT_NEAR(c.theory + c.stages_work + c.outside + c.transfers + c.other_axes, c.bubble, 1e-12);
    EXPECT_NEAR(ca[s].transfers, 0, 1e-12);
    EXPECT_NEAR(ca[s].other_axes, 0, 1e-12);
    EXPECT_DOUBLE_EQ(ca[s].theory, 1.0 / 17);  // (p-1)/(v m+p-1), m = 16 / dp 2 = 8
    // The counterfactual with communication free is the same step whatever the links.
    EXPECT_NEAR(cb[s].stages_work, ca[s].stages_work, 1e-12);
    EXPECT_NEAR(cb[s].outside, ca[s].outside, 1e-12);
  }
  EXPECT_GT(cb[0].transfers + cb[0].other_axes + cb[1].transfers + cb[1].other_axes, 0.01);
}

// Whole-gradient reductions (ZeRO 1, grad_sync = "step") are issued in the
// action that completes each unit and waited for only once the step's
// backward pass is done: under the interleaved schedule, where a chunk's
// units complete while the other chunk still has micro-batches to run,
// with overlap and with a bucket far smaller than one unit. Reducing every
// micro-batch (ZeRO 2) still waits inside the backward pass.
TEST(Simulator, WholeGradientReductionsWaitOnlyAtTheStepsEnd) {
  for (const char* zero : {"1", "2"}) {
    const plan::Plan cfg = tiny({"parallel.pp=2", "parallel.dp=2", fmt::format("parallel.zero={}", zero),
                                 "parallel.schedule=\"interleaved\"", "parallel.virtual_stages=2", "model.layers=4",
                                 "data.global_batch=16", "data.micro_batch=2", "parallel.bucket_mb=0.0001"});
    const train::Estimate e = train::estimate(cfg, true);
    for (const auto& k : e.classes) {
      const prof::Trace& t = k.trace;
      std::size_t last_backward = 0, issued = 0, waited_inside = 0;
      for (std::size_t i = 0; i < t.events.size(); ++i)
        if (t.events[i].kind == prof::TraceEvent::Kind::span_end && t.events[i].phase == prof::Phase::backward)
          last_backward = i;
      for (std::size_t i = 0; i < t.events.size(); ++i) {
        const prof::TraceEvent& ev = t.events[i];
        if (ev.comm < 0) continue;
        const prof::TraceComm& c = t.comms[std::size_t(ev.comm)];
        if (c.axis != "dp" || c.op != "reduce_scatter") continue;
        issued += ev.kind == prof::TraceEvent::Kind::comm;
        waited_inside += ev.kind == prof::TraceEvent::Kind::wait && i < last_backward;
      }
      SCOPED_TRACE(fmt::format("zero {} ranks from {}", zero, k.ranks.front()));
      EXPECT_GT(issued, 0u);
      if (std::string(zero) == "1")
        EXPECT_EQ(waited_inside, 0u);
      else
        EXPECT_GT(waited_inside, 0u);
    }
  }
}
