// Expert parallelism against the single-rank MoE run, under mpiexec: the
// experts split over ep ranks inside each data-parallel group, composed with
// ZeRO, tensor (and sequence) parallelism and pipelines. The loss trajectory
// of 10 steps (cross-entropy plus the auxiliary loss, with tokens dropped)
// within 1e-5 relative, every rank's parameters (its experts) equal to their
// slice of the single-rank run's, the routing of every step equal to the
// single-rank run's; and the all-to-all bytes of a step equal to the count
// that the recorded routing gives.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>

#include <fmt/format.h>

#include "src/comm/comm_log.hpp"
#include "src/deck/deck.hpp"
#include "src/mesh/mesh.hpp"
#include "kernels/foundation/clock.hpp"
#include "src/train/trainer.hpp"
#include "tests/mpi/estimate_check.hpp"
#include "tests/mpi/parity.hpp"
#include "tests/mpi/mpi_world.hpp"

using namespace strata;

namespace {

struct Layout {
  int ep, dp, tp = 1, pp = 1;
  int zero = 0;
  bool sp = false;
  const char* schedule = "1f1b";
  bool drop = true;  // capacity factor 1 (tokens dropped), or no capacity limit
};

constexpr int kExperts = 4, kMicroBatch = 1, kSeq = 8, kD = 16;

plan::Plan config(const Layout& l, int global_batch, int steps = 10) {
  const std::string text = fmt::format(
      "[run]\nsteps = {}\nwarmup_steps = 0\nseed = 21\n"
      "[model]\nkind = \"moe\"\nlayers = 2\nd_model = {}\nheads = 4\nvocab = 32\nseq_len = {}\n"
      "moe_experts = {}\nmoe_every = 1\nmoe_top_k = 2\nmoe_capacity_factor = 1.0\nmoe_drop_tokens = {}\n"
      "moe_aux_coef = 0.05\n"
      "[data]\nglobal_batch = {}\nmicro_batch = {}\n"
      "[parallel]\npp = {}\ndp = {}\ntp = {}\nep = {}\nsequence_parallel = {}\nschedule = \"{}\"\nzero = {}\n"
      "[optim]\nlr = 1e-2\nweight_decay = 0.1\ngrad_clip = 0.3\n"
      "[backend]\nthreads = 1\n",
      steps, kD, kSeq, kExperts, l.drop, global_batch, kMicroBatch, l.pp, l.dp, l.tp, l.ep, l.sp, l.schedule, l.zero);
  return deck::parse_deck("test.toml", text, {}).config;
}

// Tokens routed and dropped per (layer, expert) over the whole job: the
// sum of every rank's records, counted once per tensor-parallel group
// (its ranks route the same tokens alike).
using Routing = std::map<std::pair<int, int>, std::pair<std::int64_t, std::int64_t>>;
Routing job_routing(const std::vector<train::ExpertRecord>& mine, int tp) {
  const int L = 2;
  std::vector<std::int64_t> v(std::size_t(2 * L * kExperts), 0);
  for (const auto& r : mine) {
    v[std::size_t(2 * (r.layer * kExperts + r.expert))] += r.routed;
    v[std::size_t(2 * (r.layer * kExperts + r.expert) + 1)] += r.dropped;
  }
  MPI_Allreduce(MPI_IN_PLACE, v.data(), int(v.size()), MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  Routing out;
  for (int l = 0; l < L; ++l)
    for (int e = 0; e < kExperts; ++e)
      out[{l, e}] = {v[std::size_t(2 * (l * kExperts + e))] / tp, v[std::size_t(2 * (l * kExperts + e) + 1)] / tp};
  return out;
}

void check(const Layout& l) {
  SCOPED_TRACE(fmt::format("ep {} dp {} tp {} pp {} zero {} sp {} {} drop {}", l.ep, l.dp, l.tp, l.pp, l.zero, l.sp,
                           l.schedule, l.drop));
  const int m = std::max(2, l.pp), G = m * kMicroBatch * l.dp;
  core::MemoryTracker rt;
  const auto rc = config({1, 1, 1, 1, 0, false, "1f1b", l.drop}, G);
  train::Trainer ref(rc, rt, nullptr, 0.0);
  std::vector<double> losses, aux, norms;
  std::vector<Routing> routing;
  std::int64_t dropped = 0;
  for (int s = 0; s < rc.run.steps; ++s) {
    const auto r = ref.step(s);
    losses.push_back(r.loss);
    norms.push_back(r.grad_norm);
    aux.push_back(r.moe_aux);
    routing.push_back({});
    for (const auto& e : ref.expert_records()) {
      routing.back()[{e.layer, e.expert}] = {e.routed, e.dropped};
      dropped += e.dropped;
    }
  }
  EXPECT_GT(aux.back(), 0.0);
  if (l.drop) {
    EXPECT_GT(dropped, 0) << "the reference drops tokens";
  }

  comm::CommLog log(prof::now_seconds());
  mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(l.pp, l.dp, l.tp, l.ep), log);
  const auto c = config(l, G);
  core::MemoryTracker tracker;
  train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
  for (const auto& s : t.registry().specs()) {
    if (s.expert) {
      EXPECT_EQ(s.shape[0] * l.ep, kExperts) << s.name << ": experts split over ep";
    }
  }
  for (int s = 0; s < c.run.steps; ++s) {
    estimate_check::begin_step(tracker, &log, s);
    const auto r = t.step(s);
    EXPECT_NEAR(r.loss, losses[s], 1e-5 * std::fabs(losses[s])) << "step " << s;
    // Adam's step is blind to a gradient's scale; the norm is not (the
    // experts' share summed over the ep group, each counted once).
    EXPECT_NEAR(r.grad_norm, norms[s], 1e-5 * norms[s]) << "step " << s;
    EXPECT_EQ(job_routing(t.expert_records(), l.tp), routing[s]) << "routing of step " << s;
  }
  // Before full_params below, whose gathers are logged under the last step.
  estimate_check::expect_estimate_is_measured(c, tracker, t, &log, c.run.steps - 1);
  // Parameters norm-wise per tensor within 5e-4 (losses and gradient norms:
  // 1e-5). An expert's MLP runs over the rows of several micro-batches at
  // once here, one at a time on one rank: the weight gradients sum in
  // another order, and Adam turns the rounding of near-zero gradient
  // elements of an expert that took few tokens into updates of either sign.
  // That rounding floor depends on the build's order of operations: up to
  // 4.8e-5 at -O2 and 6.4e-5 at -O0 (the sanitizer build), on an expert fc or
  // proj weight; dp alone 5e-6. A token's row lost or counted twice moves
  // that expert's tensors by 1e-2 or more. The bound sits a decade above the
  // floor of either build and 20x below that defect.
  double key_abs = 0;
  std::string worst;
  EXPECT_LE(parity::params_error(t.registry(), t.strategy().full_params(), ref.registry(),
                                 ref.strategy().full_params(), &key_abs, &worst),
            5e-4)
      << worst;
  EXPECT_LE(key_abs, 1e-4);
  // The experts' all-to-alls ran on the ep axis (and nothing else did).
  std::int64_t a2a = 0;
  for (const auto& rec : log.records()) {
    if (rec.op.starts_with("all_to_all")) {
      EXPECT_EQ(rec.axis, "ep");
      EXPECT_EQ(rec.group_size, l.ep);
    }
    a2a += rec.axis == "ep";
  }
  EXPECT_GT(a2a, 0);
}

}  // namespace

// (ep, dp) in {(2, 2), (2, 4), (4, 4)} on 4 ranks, under each ZeRO stage in
// turn and without a capacity limit once; on 8 ranks, ep composed with tp 2
// (sequence parallelism on and off) and with pp 2 (1F1B and ZB-H1).
TEST(ExpertParallel, LayoutsMatchOneRank) {
  const int n = parity::world_size();
  int layouts = 0;
  auto run = [&](const Layout& l) {
    if (l.dp * l.tp * l.pp != n) return;
    check(l);
    ++layouts;
  };
  run({2, 2});
  run({2, 2, 1, 1, 2});
  run({2, 2, 1, 1, 0, false, "1f1b", false});
  run({2, 4, 1, 1, 1});
  run({4, 4, 1, 1, 3});
  run({4, 4});
  run({2, 2, 2, 1, 0, false});
  run({2, 2, 2, 1, 2, true});
  run({2, 2, 1, 2, 0, false, "1f1b"});
  run({2, 2, 1, 2, 1, false, "zb-h1"});
  run({4, 4, 2, 1, 0, true});
  run({4, 4, 1, 2, 3, false, "gpipe"});
  run({2, 4, 1, 2, 0, false, "1f1b"});
  if (n == 2 || n == 4 || n == 8) {
    EXPECT_GT(layouts, 0);
  }
}

// The all-to-all bytes of each step equal what the recorded routing says:
// per MoE block and micro-batch, the counts (E int32 per rank), then the
// kept rows (C floats each) out to the experts' ranks and back, in the
// forward pass and again in the backward pass. A rank sends its own kept
// rows out, and back the rows its experts took from every rank of its ep
// group; the records of the other ranks give the latter.
TEST(ExpertParallel, AllToAllBytesEqualTheRoutedTokens) {
  const int n = parity::world_size();
  if (n != 4 && n != 2) return;
  const Layout l{2, n};
  const int G = 2 * kMicroBatch * l.dp;
  comm::CommLog log(prof::now_seconds());
  mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(l.pp, l.dp, l.tp, l.ep), log);
  const auto c = config(l, G, 3);
  core::MemoryTracker tracker;
  train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
  const int me = mesh.axis("ep").rank(), El = kExperts / l.ep;
  for (int s = 0; s < c.run.steps; ++s) {
    log.set_step(s);
    t.step(s);
    // Kept rows per global expert on every rank of the ep group, summed
    // over this step's micro-batches and blocks.
    std::vector<std::int64_t> kept(std::size_t(kExperts), 0), all(std::size_t(kExperts * l.ep));
    for (const auto& r : t.expert_records()) kept[std::size_t(r.expert)] += r.routed - r.dropped;
    mesh.axis("ep").all_gather(kept.data(), all.data(), kExperts, comm::DType::i64);
    std::int64_t out = 0, back = 0;
    for (int e = 0; e < kExperts; ++e) out += kept[std::size_t(e)];
    for (int p = 0; p < l.ep; ++p)
      for (int el = 0; el < El; ++el) back += all[std::size_t(p * kExperts + me * El + el)];
    const std::int64_t blocks = 2, micro_batches = t.micro_batches();
    const std::int64_t want = blocks * micro_batches * kExperts * 4 + 2 * (out + back) * kD * 4;
    std::int64_t got = 0;
    for (const auto& rec : log.records())
      if (rec.step == s && rec.axis == "ep" && rec.op.starts_with("all_to_all")) got += rec.bytes;
    EXPECT_EQ(got, want) << "step " << s << ": rows out " << out << ", back " << back;
  }
}

// The bytes each rank holds under ZeRO with expert parallelism: every unit
// kept over its own group, dense units over dp (N = dp), expert units over
// edp (N = dp / ep), each padded to a multiple of N: with S_u = ceil(unit /
// N_u), params 4 N_u S_u (stages 1-2) or 4 S_u (stage 3), grads 4 N_u S_u
// (stage 1) or 4 S_u, optimizer 8 S_u, summed over the rank's units (its
// experts only).
TEST(ExpertParallel, ZeroHoldsEachKindOverItsGroup) {
  const int n = parity::world_size();
  if (n != 4) return;
  for (int zero : {1, 2, 3}) {
    SCOPED_TRACE(fmt::format("zero {}", zero));
    const Layout l{2, 4, 1, 1, zero};
    comm::CommLog log(prof::now_seconds());
    mesh::Mesh mesh(MPI_COMM_WORLD, mpi_test::grid(l.pp, l.dp, l.tp, l.ep), log);
    const auto c = config(l, 2 * kMicroBatch * l.dp, 1);
    core::MemoryTracker tracker;
    train::Trainer t(c, tracker, nullptr, 0.0, strategies::parallelize(c, &mesh));
    t.step(0);
    std::uint64_t params = 0, grads = 0, optimizer = 0, expert_elements = 0;
    for (const auto& u : t.units()) {
      bool expert = false;
      for (const auto& s : t.registry().specs())
        if (s.offset == u.begin) expert = s.expert;
      const std::uint64_t N = expert ? l.dp / l.ep : l.dp, S = (std::uint64_t(u.size()) + N - 1) / N;
      params += 4 * (zero == 3 ? S : N * S);
      grads += 4 * (zero == 1 ? N * S : S);
      optimizer += 8 * S;
      if (expert) expert_elements += std::uint64_t(u.size());
    }
    EXPECT_GT(expert_elements, 0u);
    EXPECT_EQ(tracker.current(core::MemCategory::params), params);
    EXPECT_EQ(tracker.current(core::MemCategory::grads), grads);
    EXPECT_EQ(tracker.current(core::MemCategory::optimizer), optimizer);
  }
}
