// What a layout cannot beat: a lower bound on its predicted step time, found
// without predicting it, so that `strata plan` judges layouts best first and
// stops where the rest cannot reach its table (src/train/search.hpp).
//
// The bound is the larger of two, both read from one prediction of the
// layout's ranks on a single pipeline stage (pp 1, min(2, m) micro-batches,
// no recomputation or offload) of a model of two blocks, which every layout
// differing only in its pipeline shares (cached):
//
//   compute   the first micro-batch's forward and backward through the
//             whole model: the spans of its embedding and loss, and of a
//             block (the lesser of the two) times the model's blocks. They
//             hold the kernels and the calls the layers block on (tensor
//             and context parallelism's, ZeRO 3's gathers), not what a step
//             does once (the optimizer) or the last micro-batch adds (the
//             gradient reduction it starts). Split evenly over the p stages
//             and v chunks and run through the layout's schedule by the
//             unit-cost executor (src/sim/pipeline_sim.hpp) with transfers
//             free: the makespan of perfectly balanced stages, which no
//             real split beats. A zero-bubble schedule's backward is split
//             in halves (input, weight): a linear's weight gradient is at
//             most half its backward, and the bubble is least at half.
//   axes      per communication axis, the bytes of the calls on it over the
//             step (those of the two-block model, grown by a block's worth
//             L - 2 times), the busiest stage's share of them (1/p), priced
//             as one call at the full rate: calls on one axis progress one
//             after another (src/sim/simulator.hpp). Pipeline transfers and
//             point-to-point calls are left out.
//
// Recomputation, offload, pipeline transfers, the optimizer and further
// micro-batches only add to a step, so the bound holds for every
// recomputation and offload the layout may take. The tests hold it under
// every prediction of an exhaustive plan.
#pragma once

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "plan/plan.hpp"
#include "src/sim/machine.hpp"

namespace strata::train {

// A step of many micro-batches along a line: a pipeline's steady state adds
// one period per micro-batch (per group of pp where a schedule runs them in
// such groups, several chunks per rank), from m1, twice its depth, past its
// warm-up. A layout with at most m2 = m1 + period micro-batches per rank is
// simulated whole (`whole`); one with more at m1 and m2, its figures
// extended along the line to its own count, `t` periods past m1. The
// planner's predictions and their bound take the same line.
struct MicroBatchLine {
  int m1 = 0, m2 = 0;
  bool whole = true;
  double t = 0;
  double operator()(double at_m1, double at_m2) const { return at_m1 + t * (at_m2 - at_m1); }
};
MicroBatchLine micro_batch_line(const plan::Plan& layout);

class StepBound {
 public:
  explicit StepBound(const sim::Machine& machine) : machine_(machine) {}
  // Seconds; 0 where no bound can be given (a layout the deck's checks or
  // the schedule refuse: the planner judges it, and it is refused quickly).
  double operator()(const plan::Plan& layout);

  double pipeline(const plan::Plan& layout);  // the compute bound
  double axes(const plan::Plan& layout);      // the communication bound

 private:
  // What the layout's ranks do on one stage (a prediction at pp 1 of
  // min(2, m) micro-batches of a two-block model): the first micro-batch's
  // forward and backward through the whole model (blocks times the
  // model's), and per class of ranks, per axis, its calls' bytes by op over
  // the step (grown to the model's blocks).
  using Volumes = std::vector<std::map<std::string, std::map<std::string, double>>>;
  struct Stage {
    double forward = 0, backward = 0;
    bool known = false;
    Volumes volumes;
  };
  const Stage& stage(const plan::Plan& layout);

  const sim::Machine& machine_;
  // By tp, cp, sp, ep, dp, zero, shard, micro-batch and min(2, m).
  std::map<std::tuple<int, int, bool, int, int, int, int, int, int>, Stage> stages_;
  // By the same but m, then the schedule, pp and v.
  std::map<std::tuple<int, int, bool, int, int, int, int, int, std::string, int, int>, double> pipelines_;
};

}  // namespace strata::train
