// HostStagedCommunicator: device buffers copied through host memory around
// the wrapped (host-only) communicator's calls.
#include "src/comm/staged_communicator.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>

#include "src/comm/cuda_support.hpp"
#include "kernels/foundation/error.hpp"

namespace strata::comm {

namespace {

std::size_t bytes_of(std::int64_t count, DType t, const char* call) {
  if (count < 0) core::runtime_error("{}: count {} is negative", call, count);
  return std::size_t(count) * dtype_size(t);
}

void to_host(void* dst, const void* src, std::size_t n) {
  if (n > 0) STRATA_COMM_CHECK_CUDA(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
}

void to_device(void* dst, const void* src, std::size_t n) {
  if (n > 0) STRATA_COMM_CHECK_CUDA(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
}

// `v` grown to at least n bytes (never shrunk: blocking calls reuse it).
std::byte* grown(std::vector<std::byte>& v, std::size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// One past the last element a v-call touches in one of its buffers.
std::size_t extent(int peers, const std::int64_t* counts, const std::int64_t* displs, DType t) {
  std::int64_t end = 0;
  for (int p = 0; p < peers; ++p) {
    if (counts[p] < 0 || displs[p] < 0)
      core::runtime_error("all_to_allv: count {} or displacement {} for rank {} is negative", counts[p], displs[p], p);
    if (counts[p] > 0) end = std::max(end, displs[p] + counts[p]);
  }
  return std::size_t(end) * dtype_size(t);
}

// A non-blocking call's staging, owned by its request until the operation
// completes; then the results are copied back to the device.
class StagedRequest : public Request {
 public:
  StagedRequest() = default;
  StagedRequest(const StagedRequest&) = delete;
  StagedRequest& operator=(const StagedRequest&) = delete;

  ~StagedRequest() override {
    if (done_ || !inner) return;
    finish_in_destructor(*this, "staged request");
  }

  void wait() override {
    if (done_) return;
    inner->wait();
    copy_back();
  }

  bool test() override {
    if (done_) return true;
    if (!inner->test()) return false;
    copy_back();
    return true;
  }

  // Filled in by the communicator: host copies, the inner request, and where
  // the result goes (dst_ on the device, from src_ here).
  std::vector<std::byte> in, out;
  RequestPtr inner;
  void result_to(void* dst, const std::byte* src, std::size_t bytes) { dst_ = dst, src_ = src, bytes_ = bytes; }

 private:
  void copy_back() {
    if (dst_ != nullptr) to_device(dst_, src_, bytes_);
    done_ = true;
  }

  void* dst_ = nullptr;
  const std::byte* src_ = nullptr;
  std::size_t bytes_ = 0;
  bool done_ = false;
};

}  // namespace

HostStagedCommunicator::HostStagedCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {
  STRATA_CHECK(inner_ != nullptr, "HostStagedCommunicator without a communicator to wrap");
}

// ---- blocking ----

void HostStagedCommunicator::all_reduce(void* buf, std::int64_t count, DType t, ReduceOp op) {
  if (!is_device_memory(buf)) return inner_->all_reduce(buf, count, t, op);
  const std::size_t n = bytes_of(count, t, "all_reduce");
  std::byte* h = grown(in_, n);
  to_host(h, buf, n);
  inner_->all_reduce(h, count, t, op);
  to_device(buf, h, n);
}

void HostStagedCommunicator::reduce_scatter(const void* send, void* recv, std::int64_t recv_count, DType t,
                                            ReduceOp op) {
  const bool ds = is_device_memory(send), dr = is_device_memory(recv);
  if (!ds && !dr) return inner_->reduce_scatter(send, recv, recv_count, t, op);
  const std::size_t rb = bytes_of(recv_count, t, "reduce_scatter"), sb = rb * std::size_t(size());
  const void* s = send;
  if (ds) {
    to_host(grown(in_, sb), send, sb);
    s = in_.data();
  }
  void* r = dr ? grown(out_, rb) : recv;
  inner_->reduce_scatter(s, r, recv_count, t, op);
  if (dr) to_device(recv, r, rb);
}

void HostStagedCommunicator::all_gather(const void* send, void* recv, std::int64_t send_count, DType t) {
  const bool ds = is_device_memory(send), dr = is_device_memory(recv);
  if (!ds && !dr) return inner_->all_gather(send, recv, send_count, t);
  const std::size_t sb = bytes_of(send_count, t, "all_gather"), rb = sb * std::size_t(size());
  const std::size_t mine = std::size_t(rank()) * sb;
  const bool in_place = static_cast<const std::byte*>(send) == static_cast<const std::byte*>(recv) + mine;
  void* r = dr ? grown(out_, rb) : recv;
  const void* s = send;
  if (in_place) {
    // Kept in place on the host too, so the inner call sees it as such.
    s = static_cast<std::byte*>(r) + mine;
    if (dr) to_host(static_cast<std::byte*>(r) + mine, send, sb);
  } else if (ds) {
    to_host(grown(in_, sb), send, sb);
    s = in_.data();
  }
  inner_->all_gather(s, r, send_count, t);
  if (dr) to_device(recv, r, rb);
}

void HostStagedCommunicator::broadcast(void* buf, std::int64_t count, DType t, int root) {
  if (!is_device_memory(buf)) return inner_->broadcast(buf, count, t, root);
  const std::size_t n = bytes_of(count, t, "broadcast");
  std::byte* h = grown(in_, n);
  if (rank() == root) to_host(h, buf, n);  // only the root's data is read
  inner_->broadcast(h, count, t, root);
  if (rank() != root) to_device(buf, h, n);
}

void HostStagedCommunicator::all_to_all(const void* send, void* recv, std::int64_t count_per_peer, DType t) {
  const bool ds = is_device_memory(send), dr = is_device_memory(recv);
  if (!ds && !dr) return inner_->all_to_all(send, recv, count_per_peer, t);
  const std::size_t n = bytes_of(count_per_peer, t, "all_to_all") * std::size_t(size());
  const void* s = send;
  if (ds) {
    to_host(grown(in_, n), send, n);
    s = in_.data();
  }
  void* r = dr ? grown(out_, n) : recv;
  inner_->all_to_all(s, r, count_per_peer, t);
  if (dr) to_device(recv, r, n);
}

void HostStagedCommunicator::all_to_allv(const void* send, const std::int64_t* send_counts,
                                         const std::int64_t* send_displs, void* recv, const std::int64_t* recv_counts,
                                         const std::int64_t* recv_displs, DType t) {
  const bool ds = is_device_memory(send), dr = is_device_memory(recv);
  if (!ds && !dr) return inner_->all_to_allv(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
  const int n = size();
  const void* s = send;
  if (ds) {
    const std::size_t sb = extent(n, send_counts, send_displs, t);
    to_host(grown(in_, sb), send, sb);
    s = in_.data();
  }
  void* r = recv;
  if (dr) r = grown(out_, extent(n, recv_counts, recv_displs, t));
  inner_->all_to_allv(s, send_counts, send_displs, r, recv_counts, recv_displs, t);
  if (!dr) return;
  // Block by block: what lies between the blocks stays untouched, as in MPI.
  const std::size_t es = dtype_size(t);
  for (int p = 0; p < n; ++p)
    if (recv_counts[p] > 0)
      to_device(static_cast<std::byte*>(recv) + std::size_t(recv_displs[p]) * es,
                static_cast<std::byte*>(r) + std::size_t(recv_displs[p]) * es, std::size_t(recv_counts[p]) * es);
}

void HostStagedCommunicator::send(const void* buf, std::int64_t count, DType t, int peer, int tag) {
  if (!is_device_memory(buf)) return inner_->send(buf, count, t, peer, tag);
  const std::size_t n = bytes_of(count, t, "send");
  to_host(grown(in_, n), buf, n);
  inner_->send(in_.data(), count, t, peer, tag);
}

void HostStagedCommunicator::recv(void* buf, std::int64_t count, DType t, int peer, int tag) {
  if (!is_device_memory(buf)) return inner_->recv(buf, count, t, peer, tag);
  const std::size_t n = bytes_of(count, t, "recv");
  std::byte* h = grown(out_, n);
  inner_->recv(h, count, t, peer, tag);
  to_device(buf, h, n);
}

void HostStagedCommunicator::probe(int peer, int tag) { inner_->probe(peer, tag); }

void HostStagedCommunicator::barrier() { inner_->barrier(); }

// ---- non-blocking: staging owned by the request ----

RequestPtr HostStagedCommunicator::iall_reduce(void* buf, std::int64_t count, DType t, ReduceOp op) {
  if (!is_device_memory(buf)) return inner_->iall_reduce(buf, count, t, op);
  const std::size_t n = bytes_of(count, t, "iall_reduce");
  auto req = std::make_unique<StagedRequest>();
  to_host(grown(req->in, n), buf, n);
  req->inner = inner_->iall_reduce(req->in.data(), count, t, op);
  req->result_to(buf, req->in.data(), n);
  return req;
}

RequestPtr HostStagedCommunicator::ireduce_scatter(const void* send, void* recv, std::int64_t recv_count, DType t,
                                                   ReduceOp op) {
  const bool ds = is_device_memory(send), dr = is_device_memory(recv);
  if (!ds && !dr) return inner_->ireduce_scatter(send, recv, recv_count, t, op);
  const std::size_t rb = bytes_of(recv_count, t, "ireduce_scatter"), sb = rb * std::size_t(size());
  auto req = std::make_unique<StagedRequest>();
  const void* s = send;
  if (ds) {
    to_host(grown(req->in, sb), send, sb);
    s = req->in.data();
  }
  void* r = dr ? grown(req->out, rb) : recv;
  req->inner = inner_->ireduce_scatter(s, r, recv_count, t, op);
  if (dr) req->result_to(recv, req->out.data(), rb);
  return req;
}

RequestPtr HostStagedCommunicator::iall_gather(const void* send, void* recv, std::int64_t send_count, DType t) {
  const bool ds = is_device_memory(send), dr = is_device_memory(recv);
  if (!ds && !dr) return inner_->iall_gather(send, recv, send_count, t);
  const std::size_t sb = bytes_of(send_count, t, "iall_gather"), rb = sb * std::size_t(size());
  const std::size_t mine = std::size_t(rank()) * sb;
  const bool in_place = static_cast<const std::byte*>(send) == static_cast<const std::byte*>(recv) + mine;
  auto req = std::make_unique<StagedRequest>();
  void* r = dr ? grown(req->out, rb) : recv;
  const void* s = send;
  if (in_place) {
    s = static_cast<std::byte*>(r) + mine;
    if (dr) to_host(static_cast<std::byte*>(r) + mine, send, sb);
  } else if (ds) {
    to_host(grown(req->in, sb), send, sb);
    s = req->in.data();
  }
  req->inner = inner_->iall_gather(s, r, send_count, t);
  if (dr) req->result_to(recv, req->out.data(), rb);
  return req;
}

RequestPtr HostStagedCommunicator::ibroadcast(void* buf, std::int64_t count, DType t, int root) {
  if (!is_device_memory(buf)) return inner_->ibroadcast(buf, count, t, root);
  const std::size_t n = bytes_of(count, t, "ibroadcast");
  auto req = std::make_unique<StagedRequest>();
  std::byte* h = grown(req->in, n);
  if (rank() == root) to_host(h, buf, n);
  req->inner = inner_->ibroadcast(h, count, t, root);
  if (rank() != root) req->result_to(buf, h, n);
  return req;
}

RequestPtr HostStagedCommunicator::isend(const void* buf, std::int64_t count, DType t, int peer, int tag) {
  if (!is_device_memory(buf)) return inner_->isend(buf, count, t, peer, tag);
  const std::size_t n = bytes_of(count, t, "isend");
  auto req = std::make_unique<StagedRequest>();
  to_host(grown(req->in, n), buf, n);  // kept until the send completes
  req->inner = inner_->isend(req->in.data(), count, t, peer, tag);
  return req;
}

RequestPtr HostStagedCommunicator::irecv(void* buf, std::int64_t count, DType t, int peer, int tag) {
  if (!is_device_memory(buf)) return inner_->irecv(buf, count, t, peer, tag);
  const std::size_t n = bytes_of(count, t, "irecv");
  auto req = std::make_unique<StagedRequest>();
  req->inner = inner_->irecv(grown(req->out, n), count, t, peer, tag);
  req->result_to(buf, req->out.data(), n);
  return req;
}

}  // namespace strata::comm
