// `strata simulate`: a deck's step predicted on a machine description, in
// one process, at any scale, with no MPI launch and without the hardware it
// describes. The step's work comes from the meta device (train::estimate
// with traces: the real trainer, schedules and strategies run with nothing
// behind them); its time from src/sim/simulator.hpp. The report is the one a
// run writes, marked simulated = 1, so the analysis tools read it unchanged.
#pragma once

#include <string>

#include "src/deck/deck.hpp"
#include "src/sim/machine.hpp"
#include "src/sim/simulator.hpp"
#include "src/train/estimate.hpp"
#include "src/train/run_report.hpp"

namespace strata::train {

struct SimulateOptions {
  std::string machine;  // a name under inputs/machines/ or a path
  std::string output;   // the report; empty: results/<run.name>-sim.h5
  std::string command_line;
  bool quiet = false;   // no table on stdout (plan)
  bool force = false;   // replace a file at --output
};

// A deck's predicted step: the estimate behind it and the figures.
struct Prediction {
  Estimate estimate;
  sim::StepSimulation step;
  double tokens_per_s = 0, model_flops = 0, hardware_flops = 0, mfu = 0, hfu = 0;
  double peak_flops = 0;  // the job's: every device's peak at the deck's precision
  StepRecord step_record;                // the predicted step, as a run's /steps row (loss NaN)
  std::vector<prof::Timeline> timelines;  // per pipeline stage: its simulated rank's spans
  std::vector<Bubble> bubbles;            // per pipeline stage, as measure_bubble finds a run's
};

Prediction predict(const plan::Plan& cfg, const sim::Machine& machine, const sim::SimOptions& options = {});
// The step of an estimate made with traces (a prediction's), simulated on
// `machine` under `options`: every figure of a Prediction, its estimate
// left empty (the caller holds it). Another machine or counterfactual
// without estimating, or copying the estimate, again.
Prediction replay(const Estimate& e, const plan::Plan& cfg, const sim::Machine& machine,
                  const sim::SimOptions& options = {});
// A deck's throughput figures for a step of `step_time` seconds on `machine`
// (predict's, and the planner's for a step it extends along a line).
void set_throughput(Prediction& out, const plan::Plan& cfg, const sim::Machine& machine, double step_time);

// The time a stage was blocked before its optimizer span (waiting for a
// neighbour's activations or gradients, for the other stages at a call they
// share, or in a transfer) over the pipeline's part of the step (all but
// that span): the part of its bubble that is waiting rather than work
// outside the schedule's actions.
double pipeline_wait(const sim::StageTiming& stage, double step_time);

// Where a stage's bubble comes from, as fractions of the pipeline's part of
// the step, found by replaying the step with communication free, then with
// only the pipeline's own calls priced: the schedule's theory (unit costs,
// even stages), the stages' work (uneven stages and forward, backward and
// weight-gradient costs not in the theory's ratio: waiting for a
// neighbour's compute), work outside the schedule's actions (between them,
// before the optimizer), the pipeline's transfers, and other axes' calls.
// They add up to the bubble.
struct BubbleCauses {
  double bubble = 0, theory = 0, stages_work = 0, outside = 0, transfers = 0, other_axes = 0;
};
std::vector<BubbleCauses> explain_bubbles(const plan::Plan& cfg, const sim::Machine& machine, const Prediction& pr);

// Prints the prediction and writes its report; returns the exit status.
int simulate_deck(const deck::Deck& deck, const SimulateOptions& options);

}  // namespace strata::train
