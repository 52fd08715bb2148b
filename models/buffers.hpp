// The buffers a model or layer allocates per micro-batch shape, each named
// with its element count, format and category, as the tracker counts it. A
// model allocates every buffer through Buffers, which keeps the list: what
// Model::buffers() reports, and the dry run's estimate measures.
#pragma once

#include <cstddef>
#include <cstdint>
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
  std::int64_t bytes() const { return numel * core::element_bytes(format); }
};

// Buffers from a tracker, held until this is destroyed, and their list.
class Buffers {
 public:
  explicit Buffers(core::MemoryTracker& tracker) : tracker_(&tracker) {}
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
  // At least `bytes` bytes for a layer to carve tensors of several formats
  // from, listed as fp32 words.
  std::byte* add_bytes(const std::string& name, std::int64_t bytes, core::MemCategory category) {
    return static_cast<std::byte*>(add(name, (bytes + 3) / 4, category, core::Precision::fp32).get());
  }
  // Another list's buffers (a layer's), listed here too.
  void list(const std::vector<BufferSpec>& more) { specs_.insert(specs_.end(), more.begin(), more.end()); }
  const std::vector<BufferSpec>& specs() const { return specs_; }

 private:
  core::MemoryTracker* tracker_;
  std::vector<BufferSpec> specs_;
  std::vector<core::Buffer<std::byte>> held_;
};

}  // namespace strata::models
