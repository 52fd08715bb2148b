// The state seam: where a model's parameters and gradients live. The model
// is written against this interface only: it acquires a unit's parameters
// before using them and releases them after, hints which unit comes next,
// and says when a unit's gradients of the current micro-batch are complete.
// A strategy decides what that costs: nothing (replicated), a bucketed
// all-reduce (DP), a reduce-scatter (ZeRO 1, 2), a gather on demand (ZeRO 3).
//
// A unit is a contiguous range of the flat parameter layout (for the GPT:
// wte, wpe, each block, the final norm; see models::gpt_units). Inside a unit,
// parameters sit at their registry offset minus the unit's begin.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "models/flat.hpp"
#include "models/param_registry.hpp"
#include "kernels/foundation/memory.hpp"

namespace strata::models {

struct Unit {
  std::int64_t begin = 0, end = 0;  // flat element range
  std::int64_t size() const { return end - begin; }
};

class ParamState {
 public:
  virtual ~ParamState() = default;
  // The unit's parameters in the format they are stored in (the run's), valid
  // until the matching release.
  virtual core::CPtr acquire_params(int unit) = 0;
  virtual void release_params(int unit) = 0;
  // The unit will be acquired next: a strategy may start fetching it.
  virtual void prefetch(int unit) {}
  // Where the unit's gradients accumulate (+=); valid until grads_done(unit).
  virtual float* grads(int unit) = 0;
  // The current micro-batch has added all of its contributions to the unit.
  virtual void grads_done(int unit) {}
};

// A model chunk's view of a state that holds several chunks (interleaved
// pipeline stages): the chunk's units 0..count-1 are the state's units
// first..first+count-1. Prefetch hints past the chunk's end are dropped (the
// next unit belongs to another chunk, which runs later).
class ShiftedState : public ParamState {
 public:
  ShiftedState(ParamState& inner, int first, int count) : inner_(inner), first_(first), count_(count) {}
  core::CPtr acquire_params(int unit) override { return inner_.acquire_params(first_ + unit); }
  void release_params(int unit) override { inner_.release_params(first_ + unit); }
  void prefetch(int unit) override {
    if (unit >= 0 && unit < count_) inner_.prefetch(first_ + unit);
  }
  float* grads(int unit) override { return inner_.grads(first_ + unit); }
  void grads_done(int unit) override { inner_.grads_done(first_ + unit); }

 private:
  ParamState& inner_;
  int first_, count_;
};

// Parameters of `spec` between flat elements [begin, end), initialised into
// out[0 .. end-begin) by the layout-independent keyed initialisation.
void init_flat_range(const ParamRegistry& reg, std::uint64_t seed, std::int64_t begin, std::int64_t end, float* out);
// The same in a host vector of `size` elements (at least end - begin; the
// rest zero, a padded shard's padding), or empty on the meta device, where
// no value is ever read (Flat::load and AdamW::set_master ignore it there).
std::vector<float> initial_values(const ParamRegistry& reg, std::uint64_t seed, std::int64_t begin,
                                  std::int64_t end, std::int64_t size = -1);

// n floats of device (or host) memory into a host vector, and back: what a
// checkpoint or a parity check reads and writes.
std::vector<float> to_host(const float* p, std::int64_t n);
void from_host(float* dst, const float* host, std::int64_t n);

// Sum of squares of the gradients of flat elements [begin, end) (`grads`
// points at element begin). A parameter that is whole on each of `tp_size`
// tensor-parallel ranks counts 1/tp_size, so the sum of the results over the
// tp group is the global squared norm, every element counted once; a tied
// copy (the last pipeline stage's wte) counts 0, its twin on the first stage
// counting for both.
// `grads` is stored at `precision` (fp32 or 16-bit).
double grad_sum_squares(const ParamRegistry& reg, const void* grads, std::int64_t begin, std::int64_t end,
                        int tp_size, core::Precision precision = core::Precision::fp32);

// The trivial state: every parameter and gradient held whole on this rank,
// no communication. The single-rank run, and the base of data parallelism.
// At a 16-bit precision parameters are stored 16-bit and the model reads
// them so; so are the gradients, unless `grad_precision` is fp32 (the model
// then writes them in place), and the model accumulates a micro-batch's in
// an fp32 view of its unit (models/flat.hpp).
class ReplicatedState : public ParamState {
 public:
  ReplicatedState(const ParamRegistry& reg, std::vector<Unit> units, core::MemoryTracker& tracker,
                  std::uint64_t seed, core::Precision precision = core::Precision::fp32,
                  std::optional<core::Precision> grad_precision = {});
  core::CPtr acquire_params(int unit) override;
  void release_params(int unit) override;
  float* grads(int unit) override;
  void grads_done(int unit) override;

  // fp32 storage only.
  float* params() { return params_.f32(); }
  float* grads() { return grads_.f32(); }
  std::int64_t numel() const { return std::int64_t(params_.size()); }
  const std::vector<Unit>& units() const { return units_; }
  void zero_grads() { grads_.zero(); }

 protected:
  std::vector<Unit> units_;
  Flat params_, grads_;
  WideGrads wide_grads_;
};

}  // namespace strata::models
