// The state seam, seen from the trainer: a strategy owns the parameters,
// gradients and optimizer state of a run and decides where they live and how
// they are synchronised over the data-parallel group. "dp" (zero = 0) keeps
// everything replicated and all-reduces gradient buckets during the backward
// pass; "zero" (stages 1, 2, 3) shards optimizer state, then gradients, then
// parameters; with expert parallelism, "ep" keeps expert units apart, each
// kind under one of those over its own group. Adding a strategy is adding a
// file and its row in state_rows() (strategies/registry.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "models/param_registry.hpp"
#include "models/state.hpp"
#include "models/optimizer.hpp"
#include "kernels/foundation/communicator.hpp"
#include "kernels/foundation/memory.hpp"

namespace strata::strategies {

class StateStrategy;
struct StateConfig;
// Builds a state strategy over the parameters of `reg` cut into `units`,
// synchronised over `group` (null: one rank): a state row's factory.
using StateFactory = std::unique_ptr<StateStrategy> (*)(const StateConfig&, const models::ParamRegistry& reg,
                                                       std::vector<models::Unit> units, comm::Communicator* group,
                                                       core::MemoryTracker& tracker);

struct StateConfig {
  StateFactory make = nullptr;               // the chosen state row's
  int zero = 0;                              // the ZeRO stage (1, 2, 3) for zero
  std::int64_t bucket_bytes = 25 << 20;      // DP all-reduce bucket (PyTorch DDP's default)
  bool overlap = true;                       // reductions launched during the backward pass, or after it
  // ZeRO 2-3: gradients reduced into the shard after every micro-batch, or
  // (false) accumulated whole and reduced once a step (parallel.grad_sync).
  bool reduce_every_micro_batch = true;
  models::AdamWSettings adamw;
  std::uint64_t seed = 0;
  int tp_size = 1;                           // tensor-parallel ranks (for the gradient norm's weights)
  // Hybrid sharding: the group holding the same shard on other shard groups,
  // over which the shard's gradients are all-reduced (null: none).
  comm::Communicator* replica = nullptr;
  models::HostOffload offload;               // optimizer state on the host (parallel.offload = "host")
  // fp32, or mixed precision: parameters and gradients 16-bit, fp32 master
  // weights and moments in the optimizer (backend.precision).
  core::Precision precision = core::Precision::fp32;
  // Mixed precision with fp32 gradients (parallel.grad_reduce = "fp32").
  bool fp32_grads = false;
  core::Precision grad_precision() const { return fp32_grads ? core::Precision::fp32 : precision; }
};

// A named range of a strategy's state buffers (parameters as this rank holds
// them, optimizer moments): the list of them is the rank's whole training
// state, what a checkpoint saves and restores.
struct StateTensor {
  std::string name;
  void* data;
  std::int64_t count;
  int element_bytes = 4;  // 2 for 16-bit parameters
  std::size_t bytes() const { return std::size_t(count) * std::size_t(element_bytes); }
};

// A unit's gradients as the strategy stores them (unit_grads).
struct GradSpan {
  void* data;
  std::int64_t count;
  comm::DType dtype;
};

// The whole training state of a rank's parameters in registry layout:
// parameters and AdamW's two moments, each registry.numel() elements. In
// mixed precision the parameters are the fp32 master weights (the 16-bit
// ones are their rounding).
struct FullState {
  std::vector<float> params, m, v;
};

class StateStrategy {
 public:
  virtual ~StateStrategy() = default;
  virtual std::string name() const = 0;
  // What the model reads parameters from and writes gradients to.
  virtual models::ParamState& state() = 0;
  // Start of an optimizer step: gradients to zero.
  virtual void begin_step() = 0;
  // Before each micro-batch; `last`: its backward completes the step's gradients.
  virtual void begin_micro_batch(bool last) = 0;
  // After the last backward: completes the gradient synchronisation over dp.
  virtual void finish_gradients() = 0;
  // This tensor-parallel rank's share of the squared global gradient norm
  // (models::grad_sum_squares), equal on every rank of the dp group; the
  // trainer sums it over the tp and pp groups.
  virtual double grad_norm_sq() = 0;
  // After finish_gradients: this rank's part of unit u's dp-reduced gradient
  // (dp: the whole unit; zero: the rank's block of it). Two ranks holding
  // units of the same size under the same dp size get matching parts, so a
  // tied parameter kept as a unit on two pipeline stages can be summed part
  // by part.
  virtual GradSpan unit_grads(int unit) = 0;
  // Scales the gradients by coef (clipping and loss-scale removal; 1 for none), applies AdamW with
  // lr at 1-based `step`, and leaves parameters ready for the next forward.
  virtual void update(float coef, float lr, int step) = 0;
  // The whole parameter vector in registry layout on every rank (collective);
  // in mixed precision the fp32 master weights.
  virtual std::vector<float> full_params() = 0;
  // Elements added so that every shard has the same size (0 for dp).
  virtual std::int64_t padding_elements() const = 0;
  // Between steps: this rank's state, every element it holds that the next
  // step reads (not gradients, which each step starts from zero).
  virtual std::vector<StateTensor> state_tensors() = 0;
  // Between steps: the full state in registry layout on every rank
  // (collective over the strategy's groups), and its inverse, which sets
  // this rank's part from a full state (no communication). What a
  // checkpoint re-shards through when the layout changes.
  virtual FullState full_state() = 0;
  virtual void set_full_state(const FullState& s) = 0;
  // NVMe offload: the optimizer state read into (host) memory, so that
  // state_tensors() can point at it, and written back; no-op otherwise.
  virtual void hold_state_in_memory(bool in_memory) = 0;
};

// The parameters of `reg` (which must outlive the strategy), cut into
// `units`, kept by cfg.make's strategy. dp: the data-parallel communicator,
// or nullptr for a single rank. With an expert-parallel group `ep` of more
// than one rank, the expert units are kept apart and synchronised over
// `edp`, the expert-data-parallel group, each kind by its own strategy of
// cfg.make (strategies/ep.hpp).
std::unique_ptr<StateStrategy> make_state_strategy(const StateConfig& cfg, const models::ParamRegistry& reg,
                                                   std::vector<models::Unit> units, comm::Communicator* dp,
                                                   core::MemoryTracker& tracker, comm::Communicator* ep = nullptr,
                                                   comm::Communicator* edp = nullptr);

}  // namespace strata::strategies
