// The buffers a model or layer allocates per micro-batch shape, each named
// with its element count, format and category, as the tracker counts it. A
// model allocates every buffer through Buffers, which keeps the list: what
// Model::buffers() reports, and the dry run's estimate measures. What only a
// running pass uses comes from the rank's Scratch, shared by its models.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/foundation/memory.hpp"
#include "kernels/foundation/ptr.hpp"

namespace strata::models {

struct BufferSpec {
  std::string name;
  std::int64_t numel;
  core::MemCategory category;
  core::Precision format = core::Precision::fp32;
  // Held once for every model of a rank (models::Scratch), not per model.
  bool shared = false;
  std::int64_t bytes() const { return numel * core::element_bytes(format); }
};

// The buffers the models of one rank share: what a forward or backward pass
// uses only while it runs (its backward scratch, the activations that
// recomputation rebuilds, a MoE layer's exchange rows). A pipeline rank
// runs one pass at a time, so its stage models (one per micro-batch and
// chunk in flight) hold their own activations and share one of each of
// these, as Megatron-LM's stages allocate them once. Buffers are keyed by
// name and size: the first request allocates, the next ones get the same.
class Scratch {
 public:
  explicit Scratch(core::MemoryTracker& tracker) : tracker_(&tracker) {}
  core::Ptr get(const BufferSpec& spec) {
    if (spec.numel == 0) return {nullptr, spec.format};
    const std::string key = spec.name + "/" + std::to_string(spec.bytes());
    auto it = held_.find(key);
    if (it == held_.end())
      it = held_.emplace(key, core::Buffer<std::byte>(*tracker_, spec.category, std::size_t(spec.bytes()), spec.name))
               .first;
    return {it->second.data(), spec.format};
  }

 private:
  core::MemoryTracker* tracker_;
  std::map<std::string, core::Buffer<std::byte>> held_;
};

// Buffers from a tracker, held until this is destroyed, and their list:
// a model's own, and those it takes from the rank's Scratch (its own one
// when it is given none).
class Buffers {
 public:
  explicit Buffers(core::MemoryTracker& tracker, Scratch* scratch = nullptr) : tracker_(&tracker), scratch_(scratch) {
    if (scratch_ == nullptr) {
      own_ = std::make_unique<Scratch>(tracker);
      scratch_ = own_.get();
    }
  }
  // numel elements of `format` (activations and their gradients in the
  // compute precision; statistics and accumulators fp32).
  core::Ptr add(const std::string& name, std::int64_t numel, core::MemCategory category, core::Precision format) {
    specs_.push_back({name, numel, category, format});
    auto& b = held_.emplace_back(*tracker_, category, std::size_t(specs_.back().bytes()), name);
    return {b.data(), format};
  }
  // numel floats.
  float* add_f32(const std::string& name, std::int64_t numel, core::MemCategory category) {
    return add(name, numel, category, core::Precision::fp32).f32();
  }
  // The same from the shared Scratch, listed once however often it is asked for.
  core::Ptr shared(const std::string& name, std::int64_t numel, core::MemCategory category, core::Precision format) {
    const BufferSpec spec{name, numel, category, format, true};
    list({spec});
    return scratch_->get(spec);
  }
  float* shared_f32(const std::string& name, std::int64_t numel, core::MemCategory category) {
    return shared(name, numel, category, core::Precision::fp32).f32();
  }
  // At least `bytes` bytes of shared scratch for a layer to carve tensors
  // of several formats from, listed as fp32 words.
  std::byte* shared_bytes(const std::string& name, std::int64_t bytes, core::MemCategory category) {
    return static_cast<std::byte*>(shared(name, (bytes + 3) / 4, category, core::Precision::fp32).get());
  }
  // Another list's buffers (a layer's), listed here too; a shared one once.
  void list(const std::vector<BufferSpec>& more) {
    for (const auto& b : more) {
      const bool listed = b.shared && std::any_of(specs_.begin(), specs_.end(), [&](const BufferSpec& s) {
                            return s.shared && s.name == b.name && s.bytes() == b.bytes();
                          });
      if (!listed) specs_.push_back(b);
    }
  }
  const std::vector<BufferSpec>& specs() const { return specs_; }
  Scratch* scratch() const { return scratch_; }

 private:
  core::MemoryTracker* tracker_;
  Scratch* scratch_;
  std::unique_ptr<Scratch> own_;
  std::vector<BufferSpec> specs_;
  std::vector<core::Buffer<std::byte>> held_;
};

}  // namespace strata::models
