// The buffers a model or layer allocates per micro-batch shape, each named
// with its element count and category, as the tracker counts it. A model
// allocates every buffer through Buffers, which keeps the list: what
// Model::buffers() reports, and the dry run's estimate measures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/foundation/memory.hpp"

namespace strata::models {

struct BufferSpec {
  std::string name;
  std::int64_t numel;
  core::MemCategory category;
};

// Float buffers from a tracker, held until this is destroyed, and their list.
class Buffers {
 public:
  explicit Buffers(core::MemoryTracker& tracker) : tracker_(&tracker) {}
  float* add(const std::string& name, std::int64_t numel, core::MemCategory category) {
    specs_.push_back({name, numel, category});
    return held_.emplace_back(*tracker_, category, std::size_t(numel), name).data();
  }
  // Another list's buffers (a layer's), listed here too.
  void list(const std::vector<BufferSpec>& more) { specs_.insert(specs_.end(), more.begin(), more.end()); }
  const std::vector<BufferSpec>& specs() const { return specs_; }

 private:
  core::MemoryTracker* tracker_;
  std::vector<BufferSpec> specs_;
  std::vector<core::Buffer<float>> held_;
};

}  // namespace strata::models
