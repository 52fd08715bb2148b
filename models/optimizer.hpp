// AdamW over a model's flat parameter buffer, parameter by parameter so that
// each named view gets its own weight decay (matrices decay; biases and norm
// gains do not, as GPT-2 and most recipes do). An element range [begin, end)
// restricts the update to a slice of the flat buffer: the hook a sharded
// optimizer (ZeRO) uses to update only its own shard.
#pragma once

#include <cstdint>

#include "models/param_registry.hpp"
#include "src/core/memory.hpp"
#include "src/core/precision.hpp"

namespace strata::models {

struct AdamWSettings {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
};

// Optimizer offload (ZeRO-Offload): the moments (and, in mixed precision,
// the fp32 master weights) live in a host arena (a tracker of its own, with
// its own limit), and each update copies the gradients of its range there
// (and, in fp32, its parameters), runs AdamW on the host and copies the
// parameters back. What moved and how long it took is summed into `stats`.
struct OffloadStats {
  double bytes_to_host = 0, bytes_to_device = 0;
  double copy_time = 0;    // s, both directions
  double update_time = 0;  // s, AdamW on the host
};
struct HostOffload {
  core::MemoryTracker* host = nullptr;  // null: no offload
  OffloadStats* stats = nullptr;
};

class AdamW {
 public:
  // Optimizer state (m and v) for the elements [begin, end) of the flat
  // buffer described by `registry`: 8 bytes per element, category optimizer.
  // `capacity` >= end - begin sizes the state when a shard is padded (ZeRO
  // keeps state for its whole padded shard so every rank holds the same bytes).
  // With `offload.host`, m and v (and staging for the range's gradients
  // and parameters) come from the host tracker instead.
  // Mixed precision (`precision` bf16 or fp16): the parameters and gradients
  // the update takes are 16-bit, and the optimizer keeps fp32 master weights
  // beside m and v (12 bytes per element, category optimizer); the caller
  // initialises them (master()).
  AdamW(const ParamRegistry& registry, std::int64_t begin, std::int64_t end, const AdamWSettings& s,
        core::MemoryTracker& tracker, std::int64_t capacity = -1, HostOffload offload = {},
        core::Precision precision = core::Precision::fp32);
  // params and grads point at element `begin` of their flat buffers, stored
  // at the optimizer's precision. The gradients count `grad_scale` times
  // (clipping, loss-scale removal); in fp32 they are scaled in place first.
  // `step` counts from 1 (bias correction).
  void update(void* params, void* grads, float grad_scale, float lr, int step);
  // The state (first and second moments, and in mixed precision the master
  // weights), capacity elements each: what a checkpoint saves.
  float* m() { return m_.data(); }
  float* v() { return v_.data(); }
  float* master() { return master_.data(); }  // null in fp32
  std::int64_t capacity() const { return std::int64_t(m_.size()); }
  bool mixed() const { return precision_ != core::Precision::fp32; }

 private:
  const ParamRegistry& reg_;
  std::int64_t begin_, end_;
  AdamWSettings s_;
  HostOffload offload_;
  core::Precision precision_;
  core::Buffer<float> m_, v_, master_;
  // Offload staging for [begin, end), at the parameters' precision.
  core::Buffer<std::byte> host_params_, host_grads_;
  void update_range(void* params, const void* grads, float grad_scale, float lr, int step);
};

}  // namespace strata::models
