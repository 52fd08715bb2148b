// Parameters and gradients at the training precision. `Flat` is a tracked
// flat array whose elements are fp32 or 16-bit (bf16, fp16): what a state
// strategy keeps its parameters and gradients in, so that mixed precision
// holds 2 bytes per parameter and per gradient for real. The model reads
// 16-bit parameters as they are stored (the kernels take them so).
//
// The kernels write parameter gradients in fp32 (a GEMM's weight gradient
// accumulates there). `WideGrads` is how a strategy that stores 16-bit
// gradients serves them: from a micro-batch's first grads() to its
// grads_done(), an fp32 accumulator of the unit's gradients, which the
// strategy then rounds into its 16-bit store (or a 16-bit reduce-scatter
// input). It is workspace, held only while in use: one unit at a time in a
// block-by-block pass, plus the tied embedding, which the head keeps from
// forward to backward.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/foundation/communicator.hpp"
#include "kernels/foundation/memory.hpp"
#include "kernels/foundation/precision.hpp"
#include "kernels/foundation/ptr.hpp"

namespace strata::models {

class Flat {
 public:
  Flat() = default;
  Flat(core::MemoryTracker& tracker, core::MemCategory c, core::Precision p, std::size_t n, std::string_view what);
  // Move-only; a moved-from Flat is empty (size 0), as a moved-from Buffer.
  Flat(Flat&& o) noexcept { *this = std::move(o); }
  Flat& operator=(Flat&& o) noexcept {
    buf_ = std::move(o.buf_);
    p_ = o.p_;
    n_ = std::exchange(o.n_, 0);
    return *this;
  }

  core::Precision precision() const { return p_; }
  bool half() const { return p_ != core::Precision::fp32; }
  std::size_t size() const { return n_; }
  std::size_t bytes() const { return buf_.bytes(); }
  comm::DType dtype() const;
  // Element i, whatever the precision (what communication takes).
  void* at(std::int64_t i) { return buf_.data() + i * core::element_bytes(p_); }
  const void* at(std::int64_t i) const { return buf_.data() + i * core::element_bytes(p_); }
  // Element i as stored: fp32 storage only, resp. 16-bit storage only.
  float* f32(std::int64_t i = 0);
  std::uint16_t* h16(std::int64_t i = 0);
  // Element i on, in its format.
  core::Ptr ptr(std::int64_t i = 0) { return {at(i), p_}; }
  void reset() { buf_.reset(), n_ = 0; }
  void zero();
  // Elements [i, i + n) set from fp32 on the device (rounded when stored 16-bit).
  void write(std::int64_t i, std::int64_t n, const float* in);
  // The same from fp32 in host memory (initial values, a checkpoint's);
  // nothing on the meta device.
  void load(std::int64_t i, std::int64_t n, const float* host);
  // Elements [i, i + n) += src's [j, j + n) (same precision; 16-bit sums
  // are rounded once).
  void add(std::int64_t i, std::int64_t n, const Flat& src, std::int64_t j);

 private:
  core::Buffer<std::byte> buf_;
  core::Precision p_ = core::Precision::fp32;
  std::size_t n_ = 0;
};

class WideGrads {
 public:
  WideGrads(core::MemoryTracker& tracker, std::size_t units);

  // Unit u's fp32 gradient accumulator of n elements, zero when created.
  float* grads(int u, std::int64_t n);
  // The accumulator if this micro-batch wrote one (else null); done() frees it.
  float* written(int u);
  void done(int u);

 private:
  core::MemoryTracker& tracker_;
  std::vector<core::Buffer<float>> grads_;
};

}  // namespace strata::models
