#include "models/optimizer.hpp"

#include <algorithm>
#include <cstring>
#include <future>
#include <utility>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/kernels.hpp"
#include "models/nvme.hpp"
#include "kernels/foundation/clock.hpp"
#include "kernels/foundation/timeline.hpp"

namespace strata::models {

AdamW::AdamW(const ParamRegistry& registry, std::int64_t begin, std::int64_t end, const AdamWSettings& s,
             core::MemoryTracker& tracker, std::int64_t capacity, HostOffload offload, core::Precision precision,
             std::optional<core::Precision> grad_precision)
    : reg_(registry), begin_(begin), end_(end), s_(s), offload_(offload), precision_(precision),
      grad_precision_(grad_precision.value_or(precision)), capacity_(capacity < 0 ? end - begin : capacity) {
  if (nvme()) {
    // Chunks of up to the file's chunk size, fewer for a small range, each
    // a multiple of 1024 elements so every transfer stays 4096-aligned.
    chunk_ = std::min(offload_.nvme->chunk_elements(), (capacity_ + 1023) / 1024 * 1024);
    const std::int64_t chunks = chunk_ == 0 ? 0 : (capacity_ + chunk_ - 1) / chunk_;
    region_ = offload_.nvme->reserve(chunks * chunk_bytes());
  } else {
    core::MemoryTracker& home = offload.host != nullptr ? *offload.host : tracker;
    const std::size_t cap = std::size_t(capacity_);
    m_ = core::Buffer<float>(home, core::MemCategory::optimizer, cap, "adamw.m");
    v_ = core::Buffer<float>(home, core::MemCategory::optimizer, cap, "adamw.v");
    if (mixed()) master_ = core::Buffer<float>(home, core::MemCategory::optimizer, cap, "fp32 master weights");
  }
  if (offload_.host != nullptr) {
    // Sized by the capacity, as the state is: every rank of a padded shard
    // holds the same bytes (the copies move end - begin elements).
    const std::size_t cap = std::size_t(capacity_);
    host_params_ = core::Buffer<std::byte>(*offload_.host, core::MemCategory::params,
                                           cap * std::size_t(core::element_bytes(precision_)),
                                           "offload: parameters on the host");
    host_grads_ = core::Buffer<std::byte>(*offload_.host, core::MemCategory::grads,
                                          cap * std::size_t(core::element_bytes(grad_precision_)),
                                          "offload: gradients on the host");
  }
}

std::int64_t AdamW::chunk_bytes() const { return chunk_ * (mixed() ? 3 : 2) * std::int64_t(sizeof(float)); }

void AdamW::set_master(const float* values) {
  if (kernels::is_meta()) return;
  const bool brought = materialize(true);
  kernels::copy_bytes(master_.data(), values, std::size_t(capacity_) * sizeof(float));
  if (brought) materialize(false);
}

bool AdamW::materialize(bool in_memory) {
  if (!nvme() || in_memory == (m_.size() != 0)) return false;
  NvmeFile& f = *offload_.nvme;
  const std::size_t cap = std::size_t(capacity_);
  if (in_memory) {
    m_ = core::Buffer<float>(*offload_.host, core::MemCategory::optimizer, cap, "adamw.m (read from NVMe)");
    v_ = core::Buffer<float>(*offload_.host, core::MemCategory::optimizer, cap, "adamw.v (read from NVMe)");
    if (mixed())
      master_ = core::Buffer<float>(*offload_.host, core::MemCategory::optimizer, cap, "master weights (from NVMe)");
  }
  float* buf = f.buffer(0);
  for (std::int64_t lo = 0; lo < capacity_; lo += chunk_) {
    const std::int64_t k = std::min(chunk_, capacity_ - lo), at = region_ + lo / chunk_ * chunk_bytes();
    float* parts[3] = {m_.data(), v_.data(), master_.data()};
    const int tensors = mixed() ? 3 : 2;
    if (in_memory) {
      f.read_async(buf, chunk_bytes(), at).get();
      for (int t = 0; t < tensors; ++t) std::copy(buf + t * chunk_, buf + t * chunk_ + k, parts[t] + lo);
    } else {
      std::fill(buf, buf + tensors * chunk_, 0.0f);
      for (int t = 0; t < tensors; ++t) std::copy(parts[t] + lo, parts[t] + lo + k, buf + t * chunk_);
      f.write_async(buf, chunk_bytes(), at).get();
    }
  }
  if (!in_memory) {
    m_.reset();
    v_.reset();
    master_.reset();
  }
  return true;
}

// A copy between device and host on a thread of its own, as a copy engine
// runs it beside the device's work; it returns the seconds it took. On the
// meta device there is nothing to copy (the trace holds the transfer) and no
// thread is started: a dry run or a planner estimating thousands of
// layouts would otherwise start two per optimizer range and step.
namespace {
template <typename F>
std::future<double> start_copy(F&& copy) {
  if (kernels::is_meta()) return std::async(std::launch::deferred, [] { return 0.0; });
  return std::async(std::launch::async, std::forward<F>(copy));
}
}  // namespace

void AdamW::stage(const void* params, const void* grads) {
  if (offload_.host == nullptr || copy_in_.valid()) return;
  // Gradients to the host (and in fp32 the parameters: in mixed precision
  // the host holds the master weights).
  const std::size_t n = std::size_t(end_ - begin_);
  const std::size_t grad_bytes = n * std::size_t(core::element_bytes(grad_precision_));
  const std::size_t param_bytes = mixed() ? 0 : n * sizeof(float);
  void* hg = host_grads_.data();
  void* hp = host_params_.data();
  copy_in_trace_ = prof::trace_transfer("copy_to_host", "host", std::int64_t(grad_bytes + param_bytes));
  copy_in_ = start_copy([=] {
    const double t0 = prof::now_seconds();
    kernels::copy_bytes(hg, grads, grad_bytes);
    if (param_bytes != 0) kernels::copy_bytes(hp, params, param_bytes);
    return prof::now_seconds() - t0;
  });
  if (OffloadStats* st = offload_.stats) st->bytes_to_host += double(grad_bytes + param_bytes);
}

double AdamW::wait_for(std::future<double>& copy, int& trace) {
  if (!copy.valid()) return 0;
  prof::trace_wait(trace);
  trace = -1;
  const double t0 = prof::now_seconds();
  const double took = copy.get();
  const double waited = prof::now_seconds() - t0;
  if (OffloadStats* st = offload_.stats) {
    st->copy_time += took;
    st->copy_wait_time += waited;
  }
  return waited;
}

void AdamW::finish() { wait_for(copy_out_, copy_out_trace_); }

void AdamW::update(void* params, void* grads, float grad_scale, float lr, int step) {
  const std::int64_t n = end_ - begin_;
  if (offload_.host == nullptr) {
    if (!half_grads() && grad_scale != 1.0f) {
      kernels::scale_inplace(static_cast<float*>(grads), grad_scale, n);
      grad_scale = 1.0f;
    }
    update_span(begin_, end_, params, grads, m_.data(), v_.data(), master_.data(), grad_scale, lr, step, false);
    return;
  }
  // The copy to the host (already in flight if staged), the update there,
  // and the parameters' copy back, left in flight until finish().
  finish();  // a previous step's copy back, should it still run
  stage(params, grads);
  wait_for(copy_in_, copy_in_trace_);
  const double t1 = prof::now_seconds();
  if (!half_grads() && grad_scale != 1.0f && !kernels::is_meta()) {  // on the host copy: the device's stay as they are
    kernels::cpu::scale_inplace(reinterpret_cast<float*>(host_grads_.data()), grad_scale, n);
    grad_scale = 1.0f;
  }
  if (nvme() && m_.size() == 0)
    stream_update(host_params_.data(), host_grads_.data(), grad_scale, lr, step);
  else
    update_span(begin_, end_, host_params_.data(), host_grads_.data(), m_.data(), v_.data(), master_.data(),
                grad_scale, lr, step, true);
  const double t2 = prof::now_seconds();
  const std::size_t bytes = std::size_t(n) * std::size_t(core::element_bytes(precision_));
  const void* hp = host_params_.data();
  copy_out_trace_ = prof::trace_transfer("copy_to_device", "host", std::int64_t(bytes));
  copy_out_ = start_copy([=] {
    const double t0 = prof::now_seconds();
    kernels::copy_bytes(params, hp, bytes);
    return prof::now_seconds() - t0;
  });
  if (OffloadStats* st = offload_.stats) {
    st->bytes_to_device += double(bytes);
    st->update_time += t2 - t1;
  }
}

// Double buffering: while chunk c is updated in one buffer, chunk c + 1 is
// read into the other; then chunk c is written back from its buffer, and
// the next read into a buffer waits only for that buffer's write.
void AdamW::stream_update(void* params, const void* grads, float grad_scale, float lr, int step) {
  NvmeFile& f = *offload_.nvme;
  const std::int64_t n = end_ - begin_, chunks = (n + chunk_ - 1) / chunk_, cb = chunk_bytes();
  std::future<double> reading, writing[2];
  int reading_trace = -1, writing_trace[2] = {-1, -1};  // their places in a dry run's trace
  double io = 0, wait = 0;
  auto complete = [&](std::future<double>& op, int trace) {
    if (!op.valid()) return;
    prof::trace_wait(trace);
    const double t = prof::now_seconds();
    io += op.get();
    wait += prof::now_seconds() - t;
  };
  if (chunks > 0) {
    reading_trace = prof::trace_transfer("read", "nvme", cb);
    reading = f.read_async(f.buffer(0), cb, region_);
  }
  for (std::int64_t c = 0; c < chunks; ++c) {
    const int b = int(c % 2);
    complete(reading, reading_trace);
    if (c + 1 < chunks) {
      complete(writing[1 - b], writing_trace[1 - b]);
      reading_trace = prof::trace_transfer("read", "nvme", cb);
      reading = f.read_async(f.buffer(1 - b), cb, region_ + (c + 1) * cb);
    }
    float* m = f.buffer(b);
    const std::int64_t lo = begin_ + c * chunk_;
    update_span(lo, std::min(end_, lo + chunk_), params, grads, m, m + chunk_, mixed() ? m + 2 * chunk_ : nullptr,
                grad_scale, lr, step, true);
    writing_trace[b] = prof::trace_transfer("write", "nvme", cb);
    writing[b] = f.write_async(f.buffer(b), cb, region_ + c * cb);
  }
  complete(writing[0], writing_trace[0]);
  complete(writing[1], writing_trace[1]);
  if (OffloadStats* st = offload_.stats) {
    st->nvme_bytes_read += double(chunks * cb);
    st->nvme_bytes_written += double(chunks * cb);
    st->nvme_io_time += io;
    st->nvme_wait_time += wait;
  }
}

void AdamW::update_span(std::int64_t lo, std::int64_t hi, void* params, const void* grads, float* m, float* v,
                        float* master, float grad_scale, float lr, int step, bool on_host) {
  // Offloaded, the update runs on the host's copies with the CPU backend,
  // whatever the device (on the meta device, nowhere: its host copies have
  // no memory either).
  const prof::OnHost host_work(on_host);  // a dry run's trace times it on the host
  on_host = on_host && !kernels::is_meta();
  auto* mixed_update = on_host ? kernels::cpu::adamw_update_mixed : kernels::adamw_update_mixed;
  auto* update = on_host ? kernels::cpu::adamw_update : kernels::adamw_update;
  auto* convert = on_host ? kernels::cpu::convert : kernels::convert;
  for (const auto& spec : reg_.specs()) {
    const std::int64_t a = std::max(spec.offset, lo), b = std::min(spec.offset + spec.numel, hi);
    if (a >= b) continue;
    const std::int64_t k = a - begin_, j = a - lo;
    const float decay = spec.decay ? s_.weight_decay : 0.0f;
    if (mixed() && half_grads()) {
      mixed_update(master + j, static_cast<std::uint16_t*>(params) + k,
                                  static_cast<const std::uint16_t*>(grads) + k, grad_scale, m + j, v + j, b - a, lr,
                                  s_.beta1, s_.beta2, s_.eps, decay, step, precision_);
    } else if (mixed()) {  // fp32 gradients (scaled already): fp32 AdamW on the master weights, then their rounding
      update(master + j, static_cast<const float*>(grads) + k, m + j, v + j, b - a, lr, s_.beta1, s_.beta2, s_.eps,
             decay, step);
      convert(core::Ptr(static_cast<std::uint16_t*>(params) + k, precision_), master + j, b - a);
    } else
      update(static_cast<float*>(params) + k, static_cast<const float*>(grads) + k, m + j, v + j,
                            b - a, lr, s_.beta1, s_.beta2, s_.eps, decay, step);
  }
}

}  // namespace strata::models
