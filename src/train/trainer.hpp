// The trainer: one optimizer step over a global batch, as gradient
// accumulation over micro-batches, then clipping, the learning-rate schedule
// and AdamW. It owns the model, the optimizer and the data stream, all
// allocated up front so that step 0's memory is the run's memory.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "models/model.hpp"
#include "models/nvme.hpp"
#include "kernels/foundation/communicator.hpp"
#include "kernels/foundation/memory.hpp"
#include "plan/plan.hpp"
#include "kernels/foundation/timeline.hpp"
#include "src/comm/comm_log.hpp"
#include "src/train/data.hpp"
#include "strategies/parallelize.hpp"
#include "strategies/pp/executor.hpp"
#include "strategies/state_strategy.hpp"

namespace strata::train {

struct StepRecord {
  int step = 0;
  bool warmup = false;        // excluded from the timing summary
  double loss = 0;            // mean over the global batch
  double lr = 0;
  double grad_norm = 0;       // before clipping
  bool clipped = false;
  double step_time = 0;       // s: the slowest rank's once the run has agreed on it (set_time), else this rank's
  double rank_step_time = 0;  // s: this rank's own
  double tokens = 0;          // global batch x sequence length
  double tokens_per_s = 0;
  double model_flops = 0;     // forward + backward, no recomputation
  double flops_per_s = 0;
  double mfu = 0;             // flops_per_s / peak
  double hardware_flops = 0;  // model_flops plus recomputed forward work
  double hfu = 0;             // hardware_flops / step_time / peak
  models::OffloadStats offload;  // optimizer offload's copies and host update (zero without)
  // Mixed precision: the loss scale the step's backward used (1 unless
  // fp16), and whether its gradients overflowed, so that the update was
  // skipped (grad_norm is then not finite).
  double loss_scale = 1;
  bool skipped = false;
  // Mixture of experts, this rank's MoE blocks (0 for a dense model): the
  // auxiliary loss (summed over blocks, mean over micro-batches), the worst
  // block's max / mean assignments per expert, and the share of assignments
  // dropped.
  double moe_aux = 0;
  double load_imbalance = 0;
  double drop_rate = 0;
  // Time this rank was blocked in communication over the step, per axis of
  // its layout (mesh::Layout::axis_names()): the communication its compute
  // did not hide.
  std::vector<double> exposed_comm;

  // The step's time and the rates that follow from it.
  void set_time(double seconds, double peak_flops);
};

// The routing of one expert of one MoE block over a step, on this rank.
struct ExpertRecord {
  int step = 0, layer = 0, expert = 0;
  std::int64_t routed = 0;   // assignments of tokens to it (k per token), before capacity
  std::int64_t dropped = 0;  // of those, past its capacity
  double prob_mass = 0;      // router probability summed over the tokens
};

// fp16's dynamic loss scaling (as PyTorch's GradScaler and DeepSpeed do):
// the backward pass runs on the loss times `scale`, so that small gradients
// survive fp16's range; a step whose gradients overflow is skipped and the
// scale halved (not below 1); after `window` good steps in a row it doubles.
// `skipped_steps` counts the steps skipped so far: step s applies AdamW's
// update number s + 1 - skipped_steps (its bias correction). What a
// checkpoint must carry beside the tensors.
struct ScalerState {
  double scale = 1;
  int good_steps = 0;
  int skipped_steps = 0;
};

class Trainer {
 public:
  // parts: the run's parallel pieces, strategies::parallelize(config,
  // mesh, tracker) (one rank's by default): the layer seams every stage model is
  // built with, the groups the state, the loss and the pipeline work over.
  Trainer(const plan::Plan& config, core::MemoryTracker& tracker, prof::Timeline* timeline, double peak_flops,
          strategies::Parallel parts = {});

  // Runs 0-based optimizer step `step` and returns its record.
  StepRecord step(int step);
  // Stage models built on this rank over all of its chunks: as many per
  // chunk as its schedule keeps (chunk, micro-batch) pairs live at once.
  std::size_t pipeline_slots() const;

  // The first chunk's first stage model (the whole model without a pipeline).
  models::Model& model() { return pipeline_ ? pipeline_->model(0) : *model_; }
  // This rank's parameters, every chunk's in turn, and their units: the
  // layout of the strategy's flat buffers.
  const models::ParamRegistry& registry() const { return registry_; }
  const std::vector<models::Unit>& units() const { return units_; }
  strategies::StateStrategy& strategy() { return *strategy_; }
  const DataSource& data() const { return *data_; }
  int micro_batches() const { return micro_batches_; }
  // The MoE routing of the last step (empty for a dense model).
  const std::vector<ExpertRecord>& expert_records() const { return experts_; }
  // The host arena optimizer offload allocates from (empty without offload).
  const core::MemoryTracker& host_tracker() const { return host_tracker_; }
  // NVMe offload's file (null without).
  const models::NvmeFile* nvme_file() const { return nvme_.get(); }
  double model_flops_per_step() const { return model_flops_per_step_; }
  const ScalerState& scaler() const { return scaler_; }
  void set_scaler(const ScalerState& s) { scaler_ = s; }

 private:
  const plan::Plan& cfg_;
  prof::Timeline* timeline_;
  double peak_flops_;
  // One micro-batch's forward and backward through the model (no pipeline),
  // and a whole step's worth of them through this rank's pipeline chunks.
  double run_micro_batches(int step, float loss_scale);
  double run_pipeline(int step, float loss_scale);
  // Sums the gradient of the tied embedding's two copies (first and last
  // pipeline stage) over the embedding group.
  void sum_tied_embedding();
  // Adds the routing of the MoE blocks of `g`'s last forward to the step's.
  // Samples first .. first + B - 1 into tokens and targets (device memory).
  void load_batch(std::int64_t first, int B, int T, std::int32_t* tokens, std::int32_t* targets);
  void record_routing(const models::Model& m);
  void finish_routing(StepRecord& r);
  struct Routing {
    std::vector<std::int64_t> routed, kept;
    std::vector<double> mass;
    double aux = 0;
  };
  std::map<int, Routing> routing_;  // per global MoE block, this step
  std::vector<ExpertRecord> experts_;

  strategies::Parallel parts_;
  // The scratch this rank's models share (models/buffers.hpp): one
  // whatever the number of stage models a pipeline schedule keeps.
  std::unique_ptr<models::Scratch> scratch_;
  std::unique_ptr<models::Model> model_;                    // without a pipeline
  std::unique_ptr<strategies::pp::Executor> pipeline_;      // with one: this rank's chunks and actions
  models::ParamRegistry registry_;
  std::vector<models::Unit> units_;

  core::Buffer<std::int32_t> mb_tokens_, mb_targets_;  // every micro-batch of a step (pipeline only)
  core::MemoryTracker host_tracker_;  // limit backend.host_memory_limit
  models::OffloadStats offload_;      // this step's
  std::unique_ptr<models::NvmeFile> nvme_;  // parallel.offload = "nvme"
  int dp_size_ = 1, dp_rank_ = 0;
  int local_T_;        // this rank's tokens of each sequence: seq_len / cp
  int micro_batches_;  // per rank and step
  core::Precision precision_;
  ScalerState scaler_;
  double model_flops_per_step_, hardware_flops_per_step_;
  std::unique_ptr<strategies::StateStrategy> strategy_;
  std::unique_ptr<DataSource> data_;
  core::Buffer<std::int32_t> tokens_, targets_;
  std::vector<std::int32_t> host_tokens_, host_targets_;  // a micro-batch as drawn, before the copy
};

}  // namespace strata::train
