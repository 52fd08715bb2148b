#include "models/optimizer.hpp"

#include <algorithm>

#include "kernels/kernels.hpp"

namespace strata::models {

AdamW::AdamW(const ParamRegistry& registry, std::int64_t begin, std::int64_t end, const AdamWSettings& s,
             core::MemoryTracker& tracker, std::int64_t capacity)
    : reg_(registry), begin_(begin), end_(end), s_(s),
      m_(tracker, core::MemCategory::optimizer, std::size_t(capacity < 0 ? end - begin : capacity), "adamw.m"),
      v_(tracker, core::MemCategory::optimizer, std::size_t(capacity < 0 ? end - begin : capacity), "adamw.v") {}

void AdamW::update(float* params, const float* grads, float lr, int step) {
  for (const auto& spec : reg_.specs()) {
    const std::int64_t lo = std::max(spec.offset, begin_), hi = std::min(spec.offset + spec.numel, end_);
    if (lo >= hi) continue;
    const std::int64_t k = lo - begin_;
    kernels::adamw_update(params + k, grads + k, m_.data() + k, v_.data() + k, hi - lo, lr, s_.beta1, s_.beta2,
                          s_.eps, spec.decay ? s_.weight_decay : 0.0f, step);
  }
}

}  // namespace strata::models
