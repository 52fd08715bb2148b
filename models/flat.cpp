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

WideGrads::WideGrads(core::MemoryTracker& tracker, std::size_t units) : tracker_(tracker), grads_(units) {}

float* WideGrads::grads(int u, std::int64_t n) {
  core::Buffer<float>& g = grads_[std::size_t(u)];
  if (g.size() == 0)  // the tracker hands out zeroed memory
    g = core::Buffer<float>(tracker_, core::MemCategory::workspace, std::size_t(n),
                            "fp32 accumulator of a unit's gradients");
  return g.data();
}

float* WideGrads::written(int u) {
  core::Buffer<float>& g = grads_[std::size_t(u)];
  return g.size() == 0 ? nullptr : g.data();
}

void WideGrads::done(int u) { grads_[std::size_t(u)].reset(); }

}  // namespace strata::models
