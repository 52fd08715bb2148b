// Expert parallelism on the state seam (DeepSpeed-MoE's and Megatron's
// expert-data parallelism): a MoE model's dense units (embeddings,
// attention, norms, routers, dense MLPs) are synchronised over the whole
// data-parallel group, its expert units over the expert-data-parallel group
// (the dp / ep ranks that hold the same experts). Each kind is kept by its
// own inner strategy (dp, or ZeRO sharded over that kind's group) with its
// own flat layout; this class routes the model's units to them.
//
// Every token's expert gradient is computed on the rank holding its expert
// (the tokens of the whole ep group arrive there), so the sum over the edp
// group is the sum over all dp ranks: with the loss scaled by 1 / (micro-
// batches x dp), both kinds end up with the global batch's mean gradient.
#pragma once

#include <algorithm>

#include <memory>
#include <vector>

#include "models/expert_seam.hpp"
#include "models/state.hpp"
#include "kernels/kernels.hpp"
#include "strategies/state_strategy.hpp"

namespace strata::strategies {

// The layer seam of expert parallelism (models/expert_seam.hpp) over the ep
// group: counts by all_to_all, rows by all_to_allv in the activations'
// format, so every exchange is profiled on the `ep` axis.
class ExpertParallelSeam final : public models::ExpertSeam {
 public:
  explicit ExpertParallelSeam(comm::Communicator& ep) : ep_(ep) {}
  int size() const override { return ep_.size(); }
  int rank() const override { return ep_.rank(); }
  void exchange_counts(const std::int32_t* send, std::int32_t* recv, std::int64_t per_peer) override {
    ep_.all_to_all(send, recv, per_peer, comm::DType::i32);
    // The meta device moves nothing: a dry run's router is balanced
    // (models/moe.cpp), so every peer sends this rank what it keeps itself.
    if (kernels::is_meta())
      for (int q = 0; q < size(); ++q)
        std::copy(send + rank() * per_peer, send + (rank() + 1) * per_peer, recv + q * per_peer);
  }
  void exchange(core::CPtr send, const std::int64_t* send_counts, const std::int64_t* send_displs, core::Ptr recv,
                const std::int64_t* recv_counts, const std::int64_t* recv_displs, std::int64_t) override {
    ep_.all_to_allv(send.get(), send_counts, send_displs, recv.get(), recv_counts, recv_displs,
                    comm::dtype_of(send.precision()));
  }

 private:
  comm::Communicator& ep_;
};

// The seam of the layer row ep: over `ep` (one rank, the plain seam, when
// null or of one rank).
std::unique_ptr<models::ExpertSeam> make_expert_seam(comm::Communicator* ep);

class ExpertParallelState final : public StateStrategy, public models::ParamState {
 public:
  // `make` builds an inner strategy over a sub-registry, its units and a
  // group (the factory's own choice of dp or ZeRO).
  using Make = StateFactory;
  ExpertParallelState(const StateConfig& cfg, const models::ParamRegistry& reg, std::vector<models::Unit> units,
                      comm::Communicator* dp, comm::Communicator* ep, comm::Communicator* edp,
                      core::MemoryTracker& tracker, Make make);

  std::string name() const override { return dense_->name(); }
  models::ParamState& state() override { return *this; }
  void begin_step() override;
  void begin_micro_batch(bool last) override;
  void finish_gradients() override;
  // The dense units' share plus the experts', summed over the ep group
  // (each ep rank holds other experts).
  double grad_norm_sq() override;
  GradSpan unit_grads(int u) override { return inner(u).unit_grads(local_[u]); }
  void update(float coef, float lr, int step) override;
  std::vector<float> full_params() override;
  std::int64_t padding_elements() const override;
  std::vector<StateTensor> state_tensors() override;
  void hold_state_in_memory(bool in_memory) override {
    dense_->hold_state_in_memory(in_memory);
    experts_->hold_state_in_memory(in_memory);
  }
  FullState full_state() override;
  void set_full_state(const FullState& s) override;

  core::CPtr acquire_params(int u) override { return inner(u).state().acquire_params(local_[u]); }
  void release_params(int u) override { inner(u).state().release_params(local_[u]); }
  void prefetch(int u) override {
    if (u >= 0 && u < int(local_.size())) inner(u).state().prefetch(local_[u]);
  }
  float* grads(int u) override { return inner(u).state().grads(local_[u]); }
  void grads_done(int u) override { inner(u).state().grads_done(local_[u]); }

 private:
  StateStrategy& inner(int u) { return expert_[u] ? *experts_ : *dense_; }
  // The rank's registry layout from the two kinds' layouts (merge), and back.
  std::vector<float> merge(const std::vector<float>& dense, const std::vector<float>& experts) const;
  void split(const std::vector<float>& whole, std::vector<float>* dense, std::vector<float>* experts) const;

  std::vector<models::Unit> units_;
  comm::Communicator* ep_;
  std::vector<char> expert_;  // per unit: an expert unit
  std::vector<int> local_;    // per unit: its index among its kind's units
  models::ParamRegistry dense_reg_, expert_reg_;  // must outlive the inner strategies
  std::unique_ptr<StateStrategy> dense_, experts_;
};

}  // namespace strata::strategies
