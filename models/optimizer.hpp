// AdamW over a model's flat parameter buffer, parameter by parameter so that
// each named view gets its own weight decay (matrices decay; biases and norm
// gains do not, as GPT-2 and most recipes do). An element range [begin, end)
// restricts the update to a slice of the flat buffer: the hook a sharded
// optimizer (ZeRO) uses to update only its own shard.
#pragma once

#include <cstdint>
#include <optional>
#include <future>
#include <vector>

#include "models/param_registry.hpp"
#include "kernels/foundation/memory.hpp"
#include "kernels/foundation/precision.hpp"

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
  double copy_time = 0;    // s, both directions (on copy threads)
  double copy_wait_time = 0;  // s, of that, what the optimizer step waited for
  double update_time = 0;  // s, AdamW on the host (with NVMe: including waits for I/O)
  // NVMe: optimizer state read from and written to the file, the time the
  // transfers took (on their own threads) and the part of it the update
  // waited for (the rest was hidden behind the update of other chunks).
  double nvme_bytes_read = 0, nvme_bytes_written = 0;
  double nvme_io_time = 0, nvme_wait_time = 0;
};
class NvmeFile;
// NVMe offload: as host offload, but the moments (and master weights) live
// in `nvme`'s file and stream through its chunk buffers during the update.
struct HostOffload {
  core::MemoryTracker* host = nullptr;  // null: no offload
  OffloadStats* stats = nullptr;
  NvmeFile* nvme = nullptr;             // with host: state on NVMe
  bool params = false;                  // ZeRO-3's parameter shard on NVMe too (offload.params)
};

class AdamW {
 public:
  // Optimizer state (m and v) for the elements [begin, end) of the flat
  // buffer described by `registry`: 8 bytes per element, category optimizer.
  // `capacity` >= end - begin sizes the state when a shard is padded (ZeRO
  // keeps state for its whole padded shard so every rank holds the same bytes).
  // With `offload.host`, m and v (and staging for the range's gradients
  // and parameters) come from the host tracker instead.
  // Mixed precision (`precision` bf16 or fp16): the parameters the update
  // takes are 16-bit, and the optimizer keeps fp32 master weights beside m
  // and v (12 bytes per element, category optimizer); the caller initialises
  // them (master()). The gradients are at `grad_precision`: the same 16-bit
  // format, or fp32 (parallel.grad_reduce = "fp32": then the master weights
  // take fp32 AdamW's update and the parameters are their rounding).
  AdamW(const ParamRegistry& registry, std::int64_t begin, std::int64_t end, const AdamWSettings& s,
        core::MemoryTracker& tracker, std::int64_t capacity = -1, HostOffload offload = {},
        core::Precision precision = core::Precision::fp32, std::optional<core::Precision> grad_precision = {});
  // params and grads point at element `begin` of their flat buffers, stored
  // at the optimizer's precisions. The gradients count `grad_scale` times
  // (clipping, loss-scale removal); fp32 gradients are scaled in place first.
  // `step` counts from 1 (bias correction).
  // With offload the copies run on their own threads: update() waits for
  // the gradients' copy to the host (started here, or earlier by stage()),
  // and returns with the parameters' copy back in flight; finish() waits
  // for it. A strategy with several optimizers stages the next one's
  // gradients before updating the current one, so copies overlap updates.
  void update(void* params, void* grads, float grad_scale, float lr, int step);
  void stage(const void* params, const void* grads);
  void finish();
  // The state (first and second moments, and in mixed precision the master
  // weights), capacity elements each: what a checkpoint saves.
  // With NVMe offload only between materialize(true) and materialize(false).
  float* m() { return m_.data(); }
  float* v() { return v_.data(); }
  float* master() { return master_.data(); }  // null in fp32
  std::int64_t capacity() const { return capacity_; }
  bool mixed() const { return precision_ != core::Precision::fp32; }
  bool half_grads() const { return grad_precision_ != core::Precision::fp32; }
  // Sets the master weights (capacity elements), wherever they live
  // (nothing on the meta device).
  void set_master(const float* values);
  // NVMe offload: reads the state from the file into host buffers, where
  // m(), v() and master() see it (a checkpoint, a parity check), and writes
  // it back and frees them. Returns whether anything changed (no-op
  // without NVMe or when already so).
  bool materialize(bool in_memory);

 private:
  const ParamRegistry& reg_;
  std::int64_t begin_, end_;
  AdamWSettings s_;
  HostOffload offload_;
  core::Precision precision_, grad_precision_;
  std::int64_t capacity_;
  core::Buffer<float> m_, v_, master_;
  // Offload staging for [begin, end), at the parameters' precision.
  core::Buffer<std::byte> host_params_, host_grads_;
  std::future<double> copy_in_, copy_out_;
  int copy_in_trace_ = -1, copy_out_trace_ = -1;  // their places in a dry run's trace
  double wait_for(std::future<double>& copy, int& trace);  // blocks; books the copy's time and the wait
  // NVMe: this optimizer's region of the file, in chunks of chunk_ elements.
  std::int64_t region_ = 0, chunk_ = 0;
  bool nvme() const { return offload_.nvme != nullptr; }
  std::int64_t chunk_bytes() const;
  // AdamW over elements [lo, hi) of the range: params and grads point at
  // element begin, m, v and master at element lo. on_host: they are the
  // host's copies (offload), updated by the CPU backend whatever the device.
  void update_span(std::int64_t lo, std::int64_t hi, void* params, const void* grads, float* m, float* v,
                   float* master, float grad_scale, float lr, int step, bool on_host);
  void stream_update(void* params, const void* grads, float grad_scale, float lr, int step);
};

// NVMe offload: the optimizers' state in memory for a scope, released at its
// end unless it was in memory already (a caller further out holds it).
class StateInMemory {
 public:
  template <typename Range>
  explicit StateInMemory(const Range& optimizers) {
    for (AdamW* o : optimizers)
      if (o->materialize(true)) brought_.push_back(o);
  }
  ~StateInMemory() {
    for (AdamW* o : brought_) o->materialize(false);
  }
  StateInMemory(const StateInMemory&) = delete;
  StateInMemory& operator=(const StateInMemory&) = delete;

 private:
  std::vector<AdamW*> brought_;
};

}  // namespace strata::models
