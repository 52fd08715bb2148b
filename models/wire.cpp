#include "models/wire.hpp"

#include <algorithm>
#include <utility>

#include "kernels/foundation/error.hpp"
#include "kernels/kernels.hpp"

namespace strata::models {

namespace {

using comm::DType;
using comm::ReduceOp;

// A non-blocking transfer and its 16-bit copy, released once the transfer
// is done (the member order makes the inner request finish first); a
// receive widens into its destination when found complete.
class WireRequest final : public comm::Request {
 public:
  WireRequest(core::Buffer<std::uint16_t> copy, core::Precision p, float* into)
      : copy_(std::move(copy)), p_(p), into_(into) {}
  void start(comm::RequestPtr inner) { inner_ = std::move(inner); }
  void wait() override {
    inner_->wait();
    arrived();
  }
  bool test() override {
    if (!inner_->test()) return false;
    arrived();
    return true;
  }
  bool device_span(double* start, double* end) const override { return inner_->device_span(start, end); }

 private:
  void arrived() {
    if (into_ != nullptr) kernels::convert(into_, core::CPtr(copy_.data(), p_), std::int64_t(copy_.size()));
    into_ = nullptr;
  }
  core::Buffer<std::uint16_t> copy_;
  core::Precision p_;
  float* into_;
  comm::RequestPtr inner_;
};

}  // namespace

Wire::Wire(core::MemoryTracker& tracker, core::Precision p) : tracker_(&tracker), p_(p) {}

core::Buffer<std::uint16_t> Wire::copy(std::int64_t n) const {
  if (n == 0) return {};
  return core::Buffer<std::uint16_t>(*tracker_, core::MemCategory::comm, std::size_t(n), "16-bit wire copy");
}

void Wire::all_reduce(comm::Communicator& c, float* x, std::int64_t n) const {
  if (!half()) return c.all_reduce(x, n, DType::f32, ReduceOp::sum);
  auto h = copy(n);
  kernels::convert(core::Ptr(h.data(), p_), x, n);
  c.all_reduce(h.data(), n, dtype(), ReduceOp::sum);
  kernels::convert(x, core::CPtr(h.data(), p_), n);
}

void Wire::all_gather(comm::Communicator& c, const float* mine, float* all, std::int64_t count) const {
  if (!half()) return c.all_gather(mine, all, count, DType::f32);
  auto h = copy(count * c.size());
  std::uint16_t* own = h.data() + std::int64_t(c.rank()) * count;
  kernels::convert(core::Ptr(own, p_), mine, count);
  c.all_gather(own, h.data(), count, dtype());
  kernels::convert(all, core::CPtr(h.data(), p_), count * c.size());
}

void Wire::reduce_scatter(comm::Communicator& c, const float* send, float* recv, std::int64_t recv_count) const {
  if (!half()) return c.reduce_scatter(send, recv, recv_count, DType::f32, ReduceOp::sum);
  auto h = copy(recv_count * (c.size() + 1));
  std::uint16_t* out = h.data() + recv_count * c.size();
  kernels::convert(core::Ptr(h.data(), p_), send, recv_count * c.size());
  c.reduce_scatter(h.data(), out, recv_count, dtype(), ReduceOp::sum);
  kernels::convert(recv, core::CPtr(out, p_), recv_count);
}

void Wire::all_to_allv(comm::Communicator& c, const float* send, const std::int64_t* send_counts,
                       const std::int64_t* send_displs, float* recv, const std::int64_t* recv_counts,
                       const std::int64_t* recv_displs, std::int64_t extent) const {
  if (!half())
    return c.all_to_allv(send, send_counts, send_displs, recv, recv_counts, recv_displs, DType::f32);
  // What the blocks span, gaps included: one narrowing and one widening.
  std::int64_t ns = 0, nr = 0;
  for (int p = 0; p < c.size(); ++p) {
    ns = std::max(ns, send_displs[p] + send_counts[p]);
    nr = std::max(nr, recv_displs[p] + recv_counts[p]);
  }
  STRATA_CHECK(ns <= extent && nr <= extent, "an exchange of {} and {} elements in buffers of {}", ns, nr, extent);
  auto h = copy(2 * extent);
  kernels::convert(core::Ptr(h.data(), p_), send, ns);
  c.all_to_allv(h.data(), send_counts, send_displs, h.data() + extent, recv_counts, recv_displs, dtype());
  kernels::convert(recv, core::CPtr(h.data() + extent, p_), nr);
}

void Wire::recv(comm::Communicator& c, float* y, std::int64_t n, int peer, int tag) const {
  if (!half()) return c.recv(y, n, DType::f32, peer, tag);
  auto h = copy(n);
  c.recv(h.data(), n, dtype(), peer, tag);
  kernels::convert(y, core::CPtr(h.data(), p_), n);
}

comm::RequestPtr Wire::isend(comm::Communicator& c, const float* x, std::int64_t n, int peer, int tag,
                             std::uint16_t* held) const {
  if (!half()) return c.isend(x, n, DType::f32, peer, tag);
  if (held != nullptr) {
    kernels::convert(core::Ptr(held, p_), x, n);
    return c.isend(held, n, dtype(), peer, tag);
  }
  auto h = copy(n);
  kernels::convert(core::Ptr(h.data(), p_), x, n);
  const std::uint16_t* data = h.data();
  auto r = std::make_unique<WireRequest>(std::move(h), p_, nullptr);
  r->start(c.isend(data, n, dtype(), peer, tag));
  return r;
}

comm::RequestPtr Wire::irecv(comm::Communicator& c, float* y, std::int64_t n, int peer, int tag) const {
  if (!half()) return c.irecv(y, n, DType::f32, peer, tag);
  auto h = copy(n);
  std::uint16_t* data = h.data();
  auto r = std::make_unique<WireRequest>(std::move(h), p_, y);
  r->start(c.irecv(data, n, dtype(), peer, tag));
  return r;
}

}  // namespace strata::models
