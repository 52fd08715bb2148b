// What the CUDA kernel tests share: a fixture that skips without a GPU and
// draws a fresh seed per run (STRATA_TEST_SEED to repeat one), uniform random
// vectors, and device copies of host vectors.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/foundation/ptr.hpp"

namespace strata::test {

using Vec = std::vector<float>;

inline unsigned test_seed() {
  if (const char* s = std::getenv("STRATA_TEST_SEED")) return unsigned(std::strtoul(s, nullptr, 10));
  return std::random_device{}();
}

inline Vec uniform(std::mt19937& g, std::size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// A device copy of a host vector, freed with the object.
template <typename T>
class DeviceOf {
 public:
  explicit DeviceOf(const std::vector<T>& h)
      : n_(h.size()), p_(static_cast<T*>(kernels::cuda::malloc_device(h.size() * sizeof(T)))) {
    kernels::cuda::copy_bytes(p_, h.data(), n_ * sizeof(T));
  }
  ~DeviceOf() { kernels::cuda::free_device(p_); }
  DeviceOf(const DeviceOf&) = delete;
  DeviceOf& operator=(const DeviceOf&) = delete;
  T* get() { return p_; }
  std::vector<T> host() const {
    kernels::cuda::synchronize();
    std::vector<T> h(n_);
    kernels::cuda::copy_bytes(h.data(), p_, n_ * sizeof(T));
    return h;
  }

 private:
  std::size_t n_;
  T* p_;
};
using Device = DeviceOf<float>;

// Values rounded to format p and widened back: what a tensor of p holds.
inline Vec rounded(Vec v, core::Precision p) {
  if (p != core::Precision::fp32)
    for (auto& x : v) x = core::half_to_float(core::float_to_half(x, p), p);
  return v;
}

// A device tensor of format p (fp32, bf16, fp16) from host values (rounded),
// read back widened.
class Tensor {
 public:
  Tensor(const Vec& values, core::Precision p) : p_(p), n_(values.size()) {
    const std::size_t bytes = n_ * std::size_t(core::element_bytes(p));
    p_data_ = kernels::cuda::malloc_device(bytes + 1);  // + 1: an empty tensor still has an address
    if (p == core::Precision::fp32) {
      kernels::cuda::copy_bytes(p_data_, values.data(), bytes);
    } else {
      std::vector<std::uint16_t> h(n_);
      for (std::size_t i = 0; i < n_; ++i) h[i] = core::float_to_half(values[i], p);
      kernels::cuda::copy_bytes(p_data_, h.data(), bytes);
    }
  }
  ~Tensor() { kernels::cuda::free_device(p_data_); }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  core::Ptr ptr() { return {p_data_, p_}; }
  Vec host() const {
    kernels::cuda::synchronize();
    Vec out(n_);
    if (p_ == core::Precision::fp32) {
      kernels::cuda::copy_bytes(out.data(), p_data_, n_ * sizeof(float));
    } else {
      std::vector<std::uint16_t> h(n_);
      kernels::cuda::copy_bytes(h.data(), p_data_, n_ * sizeof(std::uint16_t));
      for (std::size_t i = 0; i < n_; ++i) out[i] = core::half_to_float(h[i], p_);
    }
    return out;
  }

 private:
  core::Precision p_;
  std::size_t n_;
  void* p_data_ = nullptr;
};

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::cuda::device_count() == 0)
      GTEST_SKIP() << "needs a CUDA GPU (" << kernels::cuda::describe_devices()
                   << "); the CUDA kernels are compiled and linked, and run against the CPU backend on a GPU";
    seed_ = test_seed();
    RecordProperty("seed", std::to_string(seed_));
    rng_.seed(seed_);
  }
  std::string trace() const { return "seed " + std::to_string(seed_) + " (rerun with STRATA_TEST_SEED)"; }
  unsigned seed_ = 0;
  std::mt19937 rng_;
};

}  // namespace strata::test
