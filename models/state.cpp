#include "models/state.hpp"

#include <algorithm>

#include "kernels/kernels.hpp"
#include "models/init.hpp"

namespace strata::models {

void init_flat_range(const ParamRegistry& reg, std::uint64_t seed, std::int64_t begin, std::int64_t end,
                     float* out) {
  for (const auto& s : reg.specs()) {
    const std::int64_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
    if (lo < hi) init_param(out + (lo - begin), s, seed, lo - s.offset, hi - lo);
  }
}

ReplicatedState::ReplicatedState(const ParamRegistry& reg, std::vector<Unit> units, core::MemoryTracker& tracker,
                                 std::uint64_t seed)
    : units_(std::move(units)),
      params_(tracker, core::MemCategory::params, std::size_t(reg.numel()), "parameters"),
      grads_(tracker, core::MemCategory::grads, std::size_t(reg.numel()), "gradients") {
  init_flat_range(reg, seed, 0, reg.numel(), params_.data());
}

double grad_sum_squares(const ParamRegistry& reg, const float* grads, std::int64_t begin, std::int64_t end,
                        int tp_size) {
  double sq = 0;
  for (const auto& s : reg.specs()) {
    const std::int64_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
    if (lo >= hi || s.tied_copy) continue;
    const double part = kernels::sum_squares(grads + (lo - begin), hi - lo);
    sq += s.replicated() && tp_size > 1 ? part / tp_size : part;
  }
  return sq;
}

void ReplicatedState::zero_grads() { kernels::fill_zero(grads_.data(), std::int64_t(grads_.size())); }

}  // namespace strata::models
