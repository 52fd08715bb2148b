#include "src/train/bound.hpp"

#include <algorithm>
#include <array>
#include <limits>

#include "kernels/foundation/error.hpp"
#include "src/sim/pipeline_sim.hpp"
#include "src/sim/simulator.hpp"
#include "src/train/estimate.hpp"
#include "src/train/simulate.hpp"
#include "strategies/pp/schedule.hpp"
#include "strategies/registry.hpp"

namespace strata::train {

namespace {

// The layout on one pipeline stage with `m` micro-batches and neither
// recomputation nor offload: every rank's work but the pipeline's.
plan::Plan one_stage(const plan::Plan& layout, int m) {
  plan::Plan r = layout;
  r.parallel.pp = 1;
  r.parallel.schedule = &strategies::pp::find_schedule("1f1b");
  r.parallel.virtual_stages = 1;
  r.parallel.first_stage_layers = r.parallel.last_stage_layers = -1;
  r.parallel.offload = plan::Offload::none;
  r.model.recompute = plan::Recompute::none;
  r.data.global_batch = m * r.parallel.dp * r.data.micro_batch;
  return r;
}

}  // namespace

MicroBatchLine micro_batch_line(const plan::Plan& l) {
  MicroBatchLine line;
  const int m = l.micro_batches();
  const int period = l.parallel.virtual_stages > 1 ? l.parallel.pp : 1;
  line.m1 = (std::max(2, 2 * l.parallel.pp) + period - 1) / period * period;
  line.m2 = line.m1 + period;
  line.whole = m <= line.m2;
  line.t = line.whole ? 0 : double(m - line.m1) / period;
  return line;
}

const StepBound::Stage& StepBound::stage(const plan::Plan& l) {
  const auto& p = l.parallel;
  const int m = std::min(2, l.micro_batches());
  const auto key = std::make_tuple(p.tp, p.cp, p.sequence_parallel, p.ep, p.dp, p.zero, p.dp_shard,
                                   l.data.micro_batch, m);
  if (auto it = stages_.find(key); it != stages_.end()) return it->second;
  Stage st;
  try {
    // Blocks are alike, so a model of two stands for one of L: what it
    // does before, in and after its blocks, and the blocks times L.
    const int layers = l.model.layers, kept = std::min(2, layers);
    plan::Plan two = one_stage(l, m);
    two.model.layers = kept;
    const Prediction pr = predict(two, machine_);
    // The first micro-batch's spans, embedding to loss: what the layers
    // compute and the calls they block on. What a step does once (the
    // optimizer) is left out, and so is what the last micro-batch adds (the
    // gradient reduction it starts).
    double outside[2] = {0, 0};
    std::vector<std::array<double, 2>> block(std::size_t(kept), {0, 0});
    for (const prof::Span& s : pr.step.stages[0].spans) {
      if (s.micro_batch != 0 || s.layer < 0) continue;
      const int phase = s.phase == prof::Phase::forward ? 0 : 1;
      if (s.layer >= 1 && s.layer <= kept)
        block[std::size_t(s.layer - 1)][phase] += s.end - s.start;
      else
        outside[phase] += s.end - s.start;
    }
    for (int phase : {0, 1}) {
      double least = std::numeric_limits<double>::infinity();
      for (const auto& b : block) least = std::min(least, b[phase]);
      (phase == 0 ? st.forward : st.backward) = outside[phase] + layers * least;
    }
    st.known = st.forward > 0 && st.backward > 0;
    // Each axis' bytes grow by the same amount with each block: V(L) =
    // V(2) + (L - 2) (V(2) - V(1)).
    auto volumes = [](const Estimate& e) {
      Volumes v;
      for (const RankClass& k : e.classes) {
        auto& axes = v.emplace_back();
        for (const CommVolume& c : k.comm) axes[c.axis][c.op] += double(c.bytes);
      }
      return v;
    };
    st.volumes = volumes(pr.estimate);
    if (layers > kept) {
      plan::Plan one = two;
      one.model.layers = 1;
      const Volumes v1 = volumes(estimate(one));
      if (v1.size() == st.volumes.size())
        for (std::size_t k = 0; k < v1.size(); ++k)
          for (auto& [axis, ops] : st.volumes[k])
            for (auto& [op, bytes] : ops) {
              const auto a = v1[k].find(axis);
              const double b1 = a == v1[k].end() || !a->second.count(op) ? 0.0 : a->second.at(op);
              bytes += (layers - kept) * std::max(0.0, bytes - b1);
            }
    }
  } catch (const core::Error&) {
    // A shape the deck's checks refuse: no bound, and the layout's own
    // judgement says why.
  }
  return stages_.emplace(key, std::move(st)).first->second;
}

double StepBound::pipeline(const plan::Plan& l) {
  const Stage& c = stage(l);
  if (!c.known) return 0;
  const auto& p = l.parallel;
  const int m = l.micro_batches();
  if (p.pp == 1) return m * (c.forward + c.backward);
  const auto key = std::make_tuple(p.tp, p.cp, p.sequence_parallel, p.ep, p.dp, p.zero, p.dp_shard,
                                   l.data.micro_batch, std::string(p.schedule->name), p.pp, p.virtual_stages);
  if (auto it = pipelines_.find(key); it != pipelines_.end()) return it->second;
  double makespan = 0;
  if (strategies::pp::check_shape(*p.schedule, {p.pp, m, p.virtual_stages}).empty()) {
    const double chunks = double(p.pp) * p.virtual_stages;
    sim::UnitCosts u;
    u.forward = c.forward / chunks;
    u.backward = c.backward / chunks;
    // A linear's weight gradient is one of its backward's two matrix
    // products, and attention's backward has none: the weight half is at
    // most half, and the bubble a split backward leaves is least at half.
    u.backward_input = u.backward_weight = u.backward / 2;
    u.optimizer = 0;
    const auto at = [&](int micro_batches) {
      return sim::simulate(strategies::pp::make_schedule(*p.schedule, {p.pp, micro_batches, p.virtual_stages}), u)
          .makespan;
    };
    // Many micro-batches: along the line the prediction takes
    // (plan_figures), from the same two counts. Past the warm-up each
    // period adds the same span of balanced stages, which is no more than
    // what it adds to the prediction, so the bound stays under it.
    const MicroBatchLine line = micro_batch_line(l);
    makespan = line.whole ? at(m) : line(at(line.m1), at(line.m2));
  }
  return pipelines_.emplace(key, makespan).first->second;
}

double StepBound::axes(const plan::Plan& l) {
  const auto& p = l.parallel;
  const Stage& c = stage(l);
  // The layout's own groups (which ranks share a node), through its rank 0.
  const mesh::Layout layout = strategies::layout_of(l);
  double most = 0;
  for (const auto& axes : c.volumes)
    for (const auto& [axis, ops] : axes) {
      // Pipeline transfers and the tied embedding's reduction exist only
      // with several stages; the compute bound leaves them out too.
      if (axis == "pp" || axis == "emb") continue;
      std::vector<int> group;
      try {
        group = mesh::group_ranks(layout, axis, 0);
      } catch (const core::Error&) {
        continue;
      }
      if (group.size() < 2) continue;
      const sim::GroupShape shape = sim::group_shape(machine_, group);  // once for every op of the axis
      double t = 0;
      for (const auto& [op, bytes] : ops) {
        // Point-to-point calls (context parallelism's ring) go between two
        // ranks, once a micro-batch: the compute bound holds them.
        if (op == "send" || op == "recv" || op == "isend" || op == "irecv") continue;
        const double share = bytes / p.pp;
        t += std::min(sim::comm_time(machine_, op, shape, share), sim::comm_time(machine_, op, shape, share, true));
      }
      most = std::max(most, t);
    }
  return most;
}

double StepBound::operator()(const plan::Plan& l) { return std::max(pipeline(l), axes(l)); }

}  // namespace strata::train
