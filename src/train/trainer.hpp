// The trainer: one optimizer step over a global batch, as gradient
// accumulation over micro-batches, then clipping, the learning-rate schedule
// and AdamW. It owns the model, the optimizer and the data stream, all
// allocated up front so that step 0's memory is the run's memory.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "models/gpt.hpp"
#include "src/comm/communicator.hpp"
#include "src/core/memory.hpp"
#include "src/deck/config.hpp"
#include "src/prof/timeline.hpp"
#include "src/train/data.hpp"
#include "strategies/state_strategy.hpp"

namespace strata::train {

struct StepRecord {
  int step = 0;
  bool warmup = false;        // excluded from the timing summary
  double loss = 0;            // mean over the global batch
  double lr = 0;
  double grad_norm = 0;       // before clipping
  bool clipped = false;
  double step_time = 0;       // s
  double tokens = 0;          // global batch x sequence length
  double tokens_per_s = 0;
  double model_flops = 0;     // forward + backward, no recomputation
  double flops_per_s = 0;
  double mfu = 0;             // flops_per_s / peak
};

models::GptConfig gpt_config(const deck::ModelSection& m);

class Trainer {
 public:
  // dp: the data-parallel communicator (nullptr on a single rank). Each dp
  // rank takes global_batch / dp sequences of every step.
  // tp: the tensor-parallel communicator (nullptr: tp = 1).
  Trainer(const deck::Config& config, core::MemoryTracker& tracker, prof::Timeline* timeline, double peak_flops,
          comm::Communicator* dp = nullptr, comm::Communicator* tp = nullptr);

  // Runs 0-based optimizer step `step` and returns its record.
  StepRecord step(int step);

  models::Gpt& model() { return *model_; }
  strategies::StateStrategy& strategy() { return *strategy_; }
  const DataSource& data() const { return *data_; }
  int micro_batches() const { return micro_batches_; }
  double model_flops_per_step() const { return model_flops_per_step_; }

 private:
  const deck::Config& cfg_;
  prof::Timeline* timeline_;
  double peak_flops_;
  comm::Communicator* dp_;
  comm::Communicator* tp_;
  int dp_size_ = 1, dp_rank_ = 0;
  int micro_batches_;  // per rank and step
  double model_flops_per_step_;
  std::unique_ptr<models::Gpt> model_;
  std::unique_ptr<strategies::StateStrategy> strategy_;
  std::unique_ptr<DataSource> data_;
  core::Buffer<std::int32_t> tokens_, targets_;
};

}  // namespace strata::train
