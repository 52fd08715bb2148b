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

std::vector<float> initial_values(const ParamRegistry& reg, std::uint64_t seed, std::int64_t begin,
                                  std::int64_t end, std::int64_t size) {
  if (kernels::is_meta()) return {};
  std::vector<float> out(std::size_t(std::max(size, end - begin)), 0.0f);
  init_flat_range(reg, seed, begin, end, out.data());
  return out;
}

ReplicatedState::ReplicatedState(const ParamRegistry& reg, std::vector<Unit> units, core::MemoryTracker& tracker,
                                 std::uint64_t seed, core::Precision precision,
                                 std::optional<core::Precision> grad_precision)
    : units_(std::move(units)),
      params_(tracker, core::MemCategory::params, precision, std::size_t(reg.numel()), "parameters"),
      grads_(tracker, core::MemCategory::grads, grad_precision.value_or(precision), std::size_t(reg.numel()),
             "gradients"),
      wide_grads_(tracker, units_.size()) {
  params_.load(0, reg.numel(), initial_values(reg, seed, 0, reg.numel()).data());
}

core::CPtr ReplicatedState::acquire_params(int unit) { return params_.ptr(units_[std::size_t(unit)].begin); }

void ReplicatedState::release_params(int) {}

float* ReplicatedState::grads(int unit) {
  const Unit& u = units_[std::size_t(unit)];
  return grads_.half() ? wide_grads_.grads(unit, u.size()) : grads_.f32(u.begin);
}

void ReplicatedState::grads_done(int unit) {
  if (!grads_.half()) return;
  if (const float* g = wide_grads_.written(unit)) {
    const Unit& u = units_[std::size_t(unit)];
    kernels::add_inplace(grads_.ptr(u.begin), g, u.size());
    wide_grads_.done(unit);
  }
}

std::vector<float> to_host(const float* p, std::int64_t n) {
  std::vector<float> h(static_cast<std::size_t>(n));
  kernels::copy_bytes(h.data(), p, h.size() * sizeof(float));
  return h;
}

void from_host(float* dst, const float* host, std::int64_t n) {
  kernels::copy_bytes(dst, host, static_cast<std::size_t>(n) * sizeof(float));
}

double grad_sum_squares(const ParamRegistry& reg, const void* grads, std::int64_t begin, std::int64_t end,
                        int tp_size, core::Precision precision) {
  // One call for every tensor in the range (on a GPU, one read back).
  std::vector<const void*> xs;
  std::vector<std::int64_t> ns;
  std::vector<double> divisors;
  const std::int64_t bytes = core::element_bytes(precision);
  for (const auto& s : reg.specs()) {
    const std::int64_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
    if (lo >= hi || s.tied_copy) continue;
    xs.push_back(static_cast<const std::byte*>(grads) + (lo - begin) * bytes);
    ns.push_back(hi - lo);
    divisors.push_back(s.replicated() && tp_size > 1 ? double(tp_size) : 1.0);
  }
  return kernels::sum_squares_tensors(xs.data(), ns.data(), divisors.data(), int(xs.size()), precision);
}

}  // namespace strata::models
