#include "models/flat.hpp"

#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/kernels.hpp"
#include "kernels/foundation/error.hpp"

namespace strata::models {

Flat::Flat(core::MemoryTracker& tracker, core::MemCategory c, core::Precision p, std::size_t n, std::string_view what)
    : buf_(tracker, c, n * std::size_t(core::element_bytes(p)), what), p_(p), n_(n) {}

comm::DType Flat::dtype() const { return comm::dtype_of(p_); }

float* Flat::f32(std::int64_t i) {
  STRATA_CHECK(!half(), "fp32 access to {} storage", core::precision_name(p_));
  return reinterpret_cast<float*>(buf_.data()) + i;
}

std::uint16_t* Flat::h16(std::int64_t i) {
  STRATA_CHECK(half(), "16-bit access to fp32 storage");
  return reinterpret_cast<std::uint16_t*>(buf_.data()) + i;
}

void Flat::zero() { kernels::zero_bytes(buf_.data(), buf_.bytes()); }

void Flat::write(std::int64_t i, std::int64_t n, const float* in) {
  if (half())
    kernels::convert(core::Ptr(h16(i), p_), in, n);
  else
    kernels::copy_bytes(f32(i), in, sizeof(float) * std::size_t(n));
}

void Flat::load(std::int64_t i, std::int64_t n, const float* host) {
  if (kernels::is_meta()) return;  // no values, nowhere to put them
  if (!half()) return kernels::copy_bytes(f32(i), host, sizeof(float) * std::size_t(n));
  // Rounded on the host (the same rounding as the device's), then copied.
  std::vector<std::uint16_t> rounded(static_cast<std::size_t>(n));
  kernels::cpu::convert(core::Ptr(rounded.data(), p_), host, n);
  kernels::copy_bytes(h16(i), rounded.data(), rounded.size() * sizeof(std::uint16_t));
}

void Flat::add(std::int64_t i, std::int64_t n, const Flat& src, std::int64_t j) {
  STRATA_CHECK(src.p_ == p_, "adding {} to {}", core::precision_name(src.p_), core::precision_name(p_));
  kernels::add_inplace(core::Ptr(at(i), p_), core::CPtr(src.at(j), p_), n);
}

WideViews::WideViews(core::MemoryTracker& tracker, std::size_t units, core::Precision p)
    : tracker_(tracker), p_(p), views_(units) {}

float* WideViews::acquire(int u, const std::uint16_t* src, std::int64_t n) {
  View& v = views_[std::size_t(u)];
  if (v.refs++ == 0) {
    v.params = core::Buffer<float>(tracker_, core::MemCategory::workspace, std::size_t(n),
                                   "fp32 view of a unit's parameters");
    kernels::convert(v.params.data(), core::CPtr(src, p_), n);
  }
  return v.params.data();
}

void WideViews::release(int u) {
  View& v = views_[std::size_t(u)];
  STRATA_CHECK(v.refs > 0, "unit {} released more often than acquired", u);
  if (--v.refs == 0) v.params.reset();
}

float* WideViews::grads(int u, std::int64_t n) {
  View& v = views_[std::size_t(u)];
  if (v.grads.size() == 0)  // the tracker hands out zeroed memory
    v.grads = core::Buffer<float>(tracker_, core::MemCategory::workspace, std::size_t(n),
                                  "fp32 accumulator of a unit's gradients");
  return v.grads.data();
}

float* WideViews::written(int u) {
  View& v = views_[std::size_t(u)];
  return v.grads.size() == 0 ? nullptr : v.grads.data();
}

void WideViews::done(int u) { views_[std::size_t(u)].grads.reset(); }

}  // namespace strata::models
