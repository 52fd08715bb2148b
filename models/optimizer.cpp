#include "models/optimizer.hpp"

#include <algorithm>
#include <cstring>

#include "kernels/kernels.hpp"
#include "src/prof/clock.hpp"

namespace strata::models {

AdamW::AdamW(const ParamRegistry& registry, std::int64_t begin, std::int64_t end, const AdamWSettings& s,
             core::MemoryTracker& tracker, std::int64_t capacity, HostOffload offload)
    : reg_(registry), begin_(begin), end_(end), s_(s), offload_(offload),
      m_(offload.host != nullptr ? *offload.host : tracker, core::MemCategory::optimizer,
         std::size_t(capacity < 0 ? end - begin : capacity), "adamw.m"),
      v_(offload.host != nullptr ? *offload.host : tracker, core::MemCategory::optimizer,
         std::size_t(capacity < 0 ? end - begin : capacity), "adamw.v") {
  if (offload_.host != nullptr) {
    host_params_ = core::Buffer<float>(*offload_.host, core::MemCategory::params, std::size_t(end - begin),
                                       "offload: parameters on the host");
    host_grads_ = core::Buffer<float>(*offload_.host, core::MemCategory::grads, std::size_t(end - begin),
                                      "offload: gradients on the host");
  }
}

void AdamW::update(float* params, const float* grads, float lr, int step) {
  if (offload_.host == nullptr) {
    update_range(params, grads, lr, step);
    return;
  }
  // Gradients and parameters to the host, the update there, parameters back.
  const std::size_t n = std::size_t(end_ - begin_), bytes = n * sizeof(float);
  const double t0 = prof::now_seconds();
  std::memcpy(host_grads_.data(), grads, bytes);
  std::memcpy(host_params_.data(), params, bytes);
  const double t1 = prof::now_seconds();
  update_range(host_params_.data(), host_grads_.data(), lr, step);
  const double t2 = prof::now_seconds();
  std::memcpy(params, host_params_.data(), bytes);
  const double t3 = prof::now_seconds();
  if (OffloadStats* st = offload_.stats) {
    st->bytes_to_host += 2.0 * double(bytes);
    st->bytes_to_device += double(bytes);
    st->copy_time += (t1 - t0) + (t3 - t2);
    st->update_time += t2 - t1;
  }
}

void AdamW::update_range(float* params, const float* grads, float lr, int step) {
  for (const auto& spec : reg_.specs()) {
    const std::int64_t lo = std::max(spec.offset, begin_), hi = std::min(spec.offset + spec.numel, end_);
    if (lo >= hi) continue;
    const std::int64_t k = lo - begin_;
    kernels::adamw_update(params + k, grads + k, m_.data() + k, v_.data() + k, hi - lo, lr, s_.beta1, s_.beta2,
                          s_.eps, spec.decay ? s_.weight_decay : 0.0f, step);
  }
}

}  // namespace strata::models
