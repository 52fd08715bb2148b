// Data parallelism (zero = 0): parameters, gradients and optimizer state
// replicated on every rank (16 bytes per parameter with fp32 AdamW; in mixed
// precision 2 + 2 + 12: 16-bit parameters and gradients, fp32 master weights
// and moments). The flat
// gradient buffer is cut into buckets from its end, since the backward pass
// completes gradients from the last unit to the first; during the last
// micro-batch's backward each bucket's all-reduce is launched non-blocking as
// soon as every unit it covers is done, and waited for before the optimizer.
#pragma once

#include "models/state.hpp"
#include "strategies/registry.hpp"
#include "strategies/state_strategy.hpp"

namespace strata::strategies {

// The state seam's row of dp (zero = 0).
const StateRow& data_parallel_row();

class DataParallel final : public StateStrategy, public models::ReplicatedState {
 public:
  DataParallel(const StateConfig& cfg, const models::ParamRegistry& reg, std::vector<models::Unit> units,
               comm::Communicator* dp, core::MemoryTracker& tracker);

  std::string name() const override { return "dp"; }
  models::ParamState& state() override { return *this; }
  void begin_step() override;
  void begin_micro_batch(bool last) override { last_ = last; }
  void finish_gradients() override;
  double grad_norm_sq() override;
  GradSpan unit_grads(int u) override { return {grads_.at(units_[u].begin), units_[u].size(), grads_.dtype()}; }
  void update(float coef, float lr, int step) override;
  std::vector<float> full_params() override;
  std::int64_t padding_elements() const override { return 0; }
  FullState full_state() override;
  void set_full_state(const FullState& s) override;
  std::vector<StateTensor> state_tensors() override;
  void hold_state_in_memory(bool in_memory) override { optimizer_.materialize(in_memory); }

  void grads_done(int unit) override;

  struct Bucket {
    std::int64_t begin, end;  // flat element range
  };
  const std::vector<Bucket>& buckets() const { return buckets_; }

 private:
  void launch_ready(std::int64_t watermark);

  const models::ParamRegistry& reg_;
  int tp_size_;
  comm::Communicator* dp_;
  bool overlap_;                      // launch buckets during the backward pass (else in finish_gradients)
  models::AdamW optimizer_;
  std::vector<Bucket> buckets_;       // buckets_[0] is the last range of the buffer
  std::vector<comm::RequestPtr> in_flight_;
  std::size_t launched_ = 0;          // buckets_[0 .. launched_) have been launched this step
  bool last_ = true;
};

}  // namespace strata::strategies
