#include "models/optimizer.hpp"

#include <algorithm>
#include <cstring>

#include "kernels/kernels.hpp"
#include "src/prof/clock.hpp"

namespace strata::models {

AdamW::AdamW(const ParamRegistry& registry, std::int64_t begin, std::int64_t end, const AdamWSettings& s,
             core::MemoryTracker& tracker, std::int64_t capacity, HostOffload offload, core::Precision precision)
    : reg_(registry), begin_(begin), end_(end), s_(s), offload_(offload), precision_(precision) {
  core::MemoryTracker& home = offload.host != nullptr ? *offload.host : tracker;
  const std::size_t cap = std::size_t(capacity < 0 ? end - begin : capacity);
  m_ = core::Buffer<float>(home, core::MemCategory::optimizer, cap, "adamw.m");
  v_ = core::Buffer<float>(home, core::MemCategory::optimizer, cap, "adamw.v");
  if (mixed()) master_ = core::Buffer<float>(home, core::MemCategory::optimizer, cap, "fp32 master weights");
  if (offload_.host != nullptr) {
    const std::size_t bytes = std::size_t(end - begin) * std::size_t(core::element_bytes(precision));
    host_params_ = core::Buffer<std::byte>(*offload_.host, core::MemCategory::params, bytes,
                                           "offload: parameters on the host");
    host_grads_ = core::Buffer<std::byte>(*offload_.host, core::MemCategory::grads, bytes,
                                          "offload: gradients on the host");
  }
}

void AdamW::update(void* params, void* grads, float grad_scale, float lr, int step) {
  const std::int64_t n = end_ - begin_;
  if (!mixed() && grad_scale != 1.0f) {
    kernels::scale_inplace(static_cast<float*>(grads), grad_scale, n);
    grad_scale = 1.0f;
  }
  if (offload_.host == nullptr) {
    update_range(params, grads, grad_scale, lr, step);
    return;
  }
  // Gradients to the host (and in fp32 the parameters: in mixed precision
  // the host holds the master weights), the update there, parameters back.
  const std::size_t bytes = std::size_t(n) * std::size_t(core::element_bytes(precision_));
  const double t0 = prof::now_seconds();
  std::memcpy(host_grads_.data(), grads, bytes);
  if (!mixed()) std::memcpy(host_params_.data(), params, bytes);
  const double t1 = prof::now_seconds();
  update_range(host_params_.data(), host_grads_.data(), grad_scale, lr, step);
  const double t2 = prof::now_seconds();
  std::memcpy(params, host_params_.data(), bytes);
  const double t3 = prof::now_seconds();
  if (OffloadStats* st = offload_.stats) {
    st->bytes_to_host += double(bytes) * (mixed() ? 1.0 : 2.0);
    st->bytes_to_device += double(bytes);
    st->copy_time += (t1 - t0) + (t3 - t2);
    st->update_time += t2 - t1;
  }
}

void AdamW::update_range(void* params, const void* grads, float grad_scale, float lr, int step) {
  for (const auto& spec : reg_.specs()) {
    const std::int64_t lo = std::max(spec.offset, begin_), hi = std::min(spec.offset + spec.numel, end_);
    if (lo >= hi) continue;
    const std::int64_t k = lo - begin_;
    const float decay = spec.decay ? s_.weight_decay : 0.0f;
    if (mixed())
      kernels::adamw_update_mixed(master_.data() + k, static_cast<std::uint16_t*>(params) + k,
                                  static_cast<const std::uint16_t*>(grads) + k, grad_scale, m_.data() + k,
                                  v_.data() + k, hi - lo, lr, s_.beta1, s_.beta2, s_.eps, decay, step, precision_);
    else
      kernels::adamw_update(static_cast<float*>(params) + k, static_cast<const float*>(grads) + k, m_.data() + k,
                            v_.data() + k, hi - lo, lr, s_.beta1, s_.beta2, s_.eps, decay, step);
  }
}

}  // namespace strata::models
