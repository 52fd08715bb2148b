// ZeRO (Rajbhandari et al., 2020), stages 1 to 3, sharded per unit as FSDP
// does: each unit's flat range is padded to a multiple of N (the dp size) and
// rank r owns block r of every unit, so every collective is a plain
// reduce-scatter or all-gather of one unit. Per rank, with S = sum over units
// of ceil(unit / N) elements (S = Psi / N when N divides every unit):
//   stage 1: params 4 N S, grads 4 N S, optimizer 8 S   (8 Psi + 8 Psi / N)
//   stage 2: params 4 N S, grads 4 S,   optimizer 8 S   (4 Psi + 12 Psi / N)
//   stage 3: params 4 S,   grads 4 S,   optimizer 8 S   (16 Psi / N)
// plus, while in use, gathered units (params) and unreduced unit gradients
// and reduce-scatter outputs (comm).
// Hybrid sharding (parallel.dp_shard = S < dp, FSDP's HYBRID_SHARD) shards
// over the S ranks of a shard group (N = S in every figure above) and
// replicates across the dp / S groups: after the step's reduce-scatters, each
// shard's gradients are all-reduced over its replica group.
// With parallel.grad_sync = "step", stages 2 and 3 accumulate whole
// gradients over a step's micro-batches, as stage 1 does, and reduce-scatter
// them into the shard once: grads 4 N S + 4 S (FSDP's no_sync).
// Mixed precision (bf16, fp16) stores parameters and gradients 16-bit and
// keeps fp32 master weights in the optimizer, 12 bytes per owned element:
//   stage 1: params 2 N S, grads 2 N S, optimizer 12 S   (4 Psi + 12 Psi / N)
//   stage 2: params 2 N S, grads 2 S,   optimizer 12 S   (2 Psi + 14 Psi / N)
//   stage 3: params 2 S,   grads 2 S,   optimizer 12 S   (16 Psi / N)
// and every collective moves 16-bit elements; the model reads the 16-bit
// parameters as stored and writes a micro-batch's gradients into an fp32
// accumulator per unit (workspace, models::WideGrads).
#pragma once

#include <memory>
#include <vector>

#include "models/state.hpp"
#include "strategies/registry.hpp"
#include "strategies/state_strategy.hpp"

namespace strata::strategies {

// The state seam's row of zero (stages 1-3).
const StateRow& zero_row();

class Zero final : public StateStrategy, public models::ParamState {
 public:
  Zero(const StateConfig& cfg, const models::ParamRegistry& reg, std::vector<models::Unit> units,
       comm::Communicator* dp, core::MemoryTracker& tracker);
  ~Zero() override;

  std::string name() const override { return "zero" + std::to_string(stage_); }
  models::ParamState& state() override { return *this; }
  void begin_step() override;
  void begin_micro_batch(bool last) override;
  void finish_gradients() override;
  double grad_norm_sq() override;
  void update(float coef, float lr, int step) override;
  std::vector<float> full_params() override;
  GradSpan unit_grads(int u) override {
    return {own_grads(u), us_[u].own_end - us_[u].own_begin, grads_store().dtype()};
  }
  std::int64_t padding_elements() const override { return std::int64_t(n_) * shard_total_ - reg_.numel(); }

  std::vector<StateTensor> state_tensors() override;
  void hold_state_in_memory(bool in_memory) override {
    for (auto& o : optimizers_) o->materialize(in_memory);
    params_in_memory(in_memory);
  }
  FullState full_state() override;
  void set_full_state(const FullState& s) override;

  core::CPtr acquire_params(int unit) override;
  void release_params(int unit) override;
  void prefetch(int unit) override;
  float* grads(int unit) override;
  void grads_done(int unit) override;

 private:
  struct UnitShard {
    std::int64_t size;        // elements of the unit
    std::int64_t shard;       // ceil(size / N)
    std::int64_t q;           // offset of this unit's shard in the shard buffers
    std::int64_t own_begin;   // flat range this rank owns (may be empty)
    std::int64_t own_end;
  };
  // A reduce-scatter in flight: the unit's gradient contribution (stage 2, 3)
  // and the block that comes back.
  struct Pending {
    int unit;
    models::Flat input;   // empty for stage 1 (the input is the full gradient buffer)
    models::Flat output;
    comm::RequestPtr request;
    bool last = false;    // launched in the action that completes the unit's gradients (begin_micro_batch)
    const void* src = nullptr;  // what is reduced (the input's, or the full gradient buffer's block)
    bool issued = false;        // without overlap, issued only once the backward pass is done
  };
  // A gathered unit (stage 3).
  struct Gathered {
    models::Flat data;
    models::Flat source;         // offload.params: this rank's block, read from NVMe for the gather
    comm::RequestPtr request;    // set while a prefetch is in flight
    int refs = 0;
  };

  // Every rank's block of unit u (this rank's at `mine`, shard elements),
  // concatenated: N x shard elements (collective over dp).
  std::vector<float> gather_unit(int u, const float* mine);
  // Where parameters and gradients are kept (stage by stage, above) and this
  // rank's block of unit u in them, at the store's precision.
  models::Flat& params_store() { return stage_ <= 2 ? params_full_ : params_shard_; }
  models::Flat& grads_store() { return stage_ == 1 ? grads_full_ : grads_shard_; }
  // Whether whole gradients are accumulated over the step's micro-batches
  // (grads_full_) and reduced once: stage 1, and grad_sync = "step".
  bool whole_grads() const { return stage_ == 1 || !every_micro_batch_; }
  std::int64_t own_params_index(int u) const;
  std::int64_t own_grads_index(int u) const;
  void* own_params(int u) { return params_store().at(own_params_index(u)); }
  void* own_grads(int u) { return grads_store().at(own_grads_index(u)); }
  bool mixed() const { return precision_ != core::Precision::fp32; }
  bool half_grads() const { return grad_precision_ != core::Precision::fp32; }
  std::vector<models::AdamW*> optimizer_list() const;
  // A unit's reduce-scatter: issued now with overlap, else held until
  // issue_held() (the end of the micro-batch's backward pass; whole
  // gradients', the end of the step's).
  void launch_reduce_scatter(int u, models::Flat input, const void* src);
  void issue(Pending& p);
  void issue_held();
  // offload.params (stage 3): the parameter shard lives in the NVMe file,
  // one block per unit (models::NvmeFile's blocks); params_shard_ exists
  // only while brought into memory (construction, checkpoints). Unit u's
  // block from and to wherever it is; params_in_memory returns whether it
  // changed anything.
  bool params_on_nvme() const { return nvme_ != nullptr; }
  void read_params(int u, void* dst);
  void write_params(int u, const void* src);
  bool params_in_memory(bool on);
  std::int64_t param_block_bytes(int u) const {
    return us_[u].shard * core::element_bytes(precision_);
  }
  void count_block_io(int u, double seconds, bool write);
  void complete(Pending& p);
  // Hybrid sharding: unit u's shard, complete on this shard group, summed
  // over the replica group in place.
  void launch_replica_all_reduce(int u);
  void poll();
  void pop_front();

  int stage_;
  const models::ParamRegistry& reg_;
  std::vector<models::Unit> units_;
  comm::Communicator* dp_;       // the group sharding the state: dp, or hybrid sharding's shard group
  comm::Communicator* replica_;  // hybrid sharding: the same shard's holders in the other groups (null: none)
  core::MemoryTracker& tracker_;
  int n_ = 1, r_ = 0;
  int tp_size_;
  std::vector<UnitShard> us_;
  std::int64_t shard_total_ = 0;
  core::Precision precision_, grad_precision_;  // grad_precision_: parallel.grad_reduce's
  models::Flat params_full_, grads_full_;     // stages 1-2 (params), whole_grads (grads): padded N*S
  models::Flat params_shard_, grads_shard_;   // stage 3 (params), stages 2-3 (grads): S
  std::vector<std::unique_ptr<models::AdamW>> optimizers_;  // one per unit shard
  std::vector<models::Flat> unit_grads_;      // fp32, stages 2-3: this micro-batch's unreduced unit gradients
  models::WideGrads wide_grads_;              // 16-bit gradients: what the model accumulates a unit's into
  models::NvmeFile* nvme_ = nullptr;          // offload.params
  models::OffloadStats* stats_ = nullptr;
  std::vector<std::int64_t> param_region_;    // offload.params: unit u's block in the file
  std::vector<Gathered> gathered_;                   // stage 3
  std::vector<Pending> pending_;
  std::vector<comm::RequestPtr> replica_requests_;  // hybrid sharding: per unit, this step's all-reduce
  std::int64_t in_flight_bytes_ = 0;  // reduce-scatter buffer bytes held by pending_ (inputs and outputs)
  std::int64_t bucket_bytes_;         // the most of those before the oldest is waited for
  bool last_ = true;
  bool overlap_;                      // issue reduce-scatters during the backward pass (else after it)
  bool every_micro_batch_ = true;  // parallel.grad_sync (stages 2-3)
};

}  // namespace strata::strategies
