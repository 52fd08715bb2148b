// ProfiledCommunicator: stamps each call with the profiling clock around the
// inner call. Non-blocking calls return a request wrapper that completes the
// record (end, time spent inside wait/test) when it first sees the operation done.
#include "src/comm/profiled_communicator.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>

#include "kernels/foundation/clock.hpp"
#include "kernels/foundation/error.hpp"

namespace strata::comm {

namespace {

std::int64_t bytes_of(std::int64_t count, DType t) { return count * std::int64_t(dtype_size(t)); }

// The profiling clock, or the log's origin where the log is untimed.
double now(const CommLog& log) { return log.timed() ? prof::now_seconds() : log.origin(); }

// Refers to its record by index: the log's vector may reallocate meanwhile.
class ProfiledRequest : public Request {
 public:
  ProfiledRequest(RequestPtr inner, CommLog& log, std::size_t index)
      : inner_(std::move(inner)), log_(log), index_(index) {}
  ProfiledRequest(const ProfiledRequest&) = delete;
  ProfiledRequest& operator=(const ProfiledRequest&) = delete;

  ~ProfiledRequest() override {
    if (done_) return;
    // The wait is recorded too (wait() and test() log it).
    finish_in_destructor(*this, (log_.at(index_).op + " request").c_str());
  }

  void wait() override {
    // Seen complete by a test: the inner wait returns at once (on the meta
    // device it is where a dry run's trace learns the code waits here).
    if (done_) return inner_->wait();
    const double t0 = now(log_);
    inner_->wait();
    finish(t0, now(log_), true);
  }

  bool test() override {
    if (done_) return true;
    const double t0 = now(log_);
    const bool complete = inner_->test();
    finish(t0, now(log_), complete);
    return complete;
  }

 private:
  void finish(double t0, double t1, bool complete) {
    CommRecord& r = log_.at(index_);
    r.wait += t1 - t0;
    if (log_.timed()) log_.progress().spent(t0 - log_.origin(), t1 - log_.origin());
    if (complete) {
      r.end = t1 - log_.origin();
      // On a GPU the operation's own start and end, from its stream's
      // events; on the host the time spent in MPI for it (comm_log.hpp).
      double s = 0, e = 0;
      const double busy = log_.progress().complete(index_);  // leaves the calls in flight either way
      if (inner_->device_span(&s, &e)) {
        r.transfer_start = s - log_.origin(), r.transfer_end = e - log_.origin();
      } else {
        r.transfer_end = r.end;
        r.transfer_start = std::max(r.start, r.end - busy);
        r.host_estimate = true;
      }
      done_ = true;
    }
  }

  RequestPtr inner_;
  CommLog& log_;
  std::size_t index_;
  bool done_ = false;
};

}  // namespace

Intervals merged(Intervals v) {
  std::sort(v.begin(), v.end());
  Intervals out;
  for (const auto& [a, b] : v) {
    if (!out.empty() && a <= out.back().second) {
      out.back().second = std::max(out.back().second, b);
    } else {
      out.emplace_back(a, b);
    }
  }
  return out;
}

Intervals intersect(const Intervals& a, const Intervals& b) {
  Intervals out;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const double lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (lo < hi) out.emplace_back(lo, hi);
    // The one that ends first can meet nothing further of the other.
    if (a[i].second < b[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return out;
}

double covered(const Intervals& set, double t0, double t1) {
  // The first interval that ends after t0.
  auto it = std::upper_bound(set.begin(), set.end(), t0,
                             [](double t, const std::pair<double, double>& x) { return t < x.second; });
  double sum = 0;
  for (; it != set.end() && it->first < t1; ++it) sum += std::min(t1, it->second) - std::max(t0, it->first);
  return sum;
}

void HostProgress::spent(double t0, double t1) {
  inside.emplace_back(t0, t1);
  double total = 0;
  for (const InFlight& f : in_flight) total += f.bytes;
  for (InFlight& f : in_flight) {
    f.busy += (t1 - t0) * f.bytes / total;
    pieces.push_back({f.record, t0, t1, f.bytes / total});
  }
}

double HostProgress::complete(std::size_t record) {
  const auto it =
      std::find_if(in_flight.begin(), in_flight.end(), [&](const InFlight& f) { return f.record == record; });
  if (it == in_flight.end()) return 0;
  const double s = it->busy;
  in_flight.erase(it);
  return s;
}

void CommLog::clear() {
  STRATA_CHECK(progress_.in_flight.empty(), "{} non-blocking call(s) still in flight when the log is cleared",
               progress_.in_flight.size());
  records_.clear();
  progress_.inside.clear();
  progress_.pieces.clear();
}

ProfiledCommunicator::ProfiledCommunicator(std::unique_ptr<Communicator> inner, CommLog& log)
    : inner_(std::move(inner)), log_(log), rank_(inner_->rank()), size_(inner_->size()) {}

template <typename F>
void ProfiledCommunicator::blocking(const char* op, std::int64_t bytes, F&& call, int peer, int tag) {
  const double t0 = now(log_);
  call();
  const double t1 = now(log_);
  const double o = log_.origin();
  if (log_.timed()) log_.progress().spent(t0 - o, t1 - o);  // a blocking call moves the data of the calls in flight too
  double s = t0, e = t1;
  inner_->last_device_span(&s, &e);  // on a GPU, the operation's own span; the host waited t1 - t0
  log_.add(
      CommRecord{log_.step(), op, inner_->axis(), size_, bytes, false, t0 - o, t1 - o, t1 - t0, 0.0, s - o, e - o, peer, tag});
}

template <typename F>
RequestPtr ProfiledCommunicator::nonblocking(const char* op, std::int64_t bytes, F&& call, int peer, int tag) {
  const double t0 = now(log_);
  RequestPtr inner = call();
  const double t1 = now(log_);
  const double start = t0 - log_.origin();
  // end = start until the request is seen complete, so end >= start always holds.
  const std::size_t i =
      log_.add(CommRecord{log_.step(), op, inner_->axis(), size_, bytes, true, start, start, 0.0, 0.0, start, start, peer, tag});
  if (log_.timed()) {
    log_.progress().in_flight.push_back({i, double(std::max<std::int64_t>(bytes, 1)), 0.0});
    // The issuing call moves the data of the calls in flight, its own among them.
    log_.progress().spent(t0 - log_.origin(), t1 - log_.origin());
  }
  return std::make_unique<ProfiledRequest>(std::move(inner), log_, i);
}

void ProfiledCommunicator::all_reduce(void* buf, std::int64_t count, DType t, ReduceOp op) {
  blocking("all_reduce", bytes_of(count, t), [&] { inner_->all_reduce(buf, count, t, op); });
}

void ProfiledCommunicator::reduce_scatter(const void* send, void* recv, std::int64_t recv_count, DType t,
                                          ReduceOp op) {
  blocking("reduce_scatter", bytes_of(recv_count * size_, t),
           [&] { inner_->reduce_scatter(send, recv, recv_count, t, op); });
}

void ProfiledCommunicator::all_gather(const void* send, void* recv, std::int64_t send_count, DType t) {
  blocking("all_gather", bytes_of(send_count * size_, t), [&] { inner_->all_gather(send, recv, send_count, t); });
}

void ProfiledCommunicator::broadcast(void* buf, std::int64_t count, DType t, int root) {
  blocking("broadcast", bytes_of(count, t), [&] { inner_->broadcast(buf, count, t, root); });
}

void ProfiledCommunicator::all_to_all(const void* send, void* recv, std::int64_t count_per_peer, DType t) {
  blocking("all_to_all", bytes_of(count_per_peer * size_, t),
           [&] { inner_->all_to_all(send, recv, count_per_peer, t); });
}

void ProfiledCommunicator::all_to_allv(const void* send, const std::int64_t* send_counts,
                                       const std::int64_t* send_displs, void* recv, const std::int64_t* recv_counts,
                                       const std::int64_t* recv_displs, DType t) {
  std::int64_t sent = 0;
  for (int p = 0; p < size_; ++p) sent += send_counts[p];
  blocking("all_to_allv", bytes_of(sent, t),
           [&] { inner_->all_to_allv(send, send_counts, send_displs, recv, recv_counts, recv_displs, t); });
}

void ProfiledCommunicator::send(const void* buf, std::int64_t count, DType t, int peer, int tag) {
  blocking("send", bytes_of(count, t), [&] { inner_->send(buf, count, t, peer, tag); }, peer, tag);
}

// A receive is recorded in two parts: `peer_wait`, until the message has
// arrived or been announced (the peer was late: a pipeline bubble), and the
// rest of `wait`, the transfer itself (a slow link).
void ProfiledCommunicator::recv(void* buf, std::int64_t count, DType t, int peer, int tag) {
  const double t0 = now(log_);
  inner_->probe(peer, tag);
  const double t1 = now(log_);
  inner_->recv(buf, count, t, peer, tag);
  const double t2 = now(log_);
  const double o = log_.origin();
  if (log_.timed()) log_.progress().spent(t0 - o, t2 - o);
  log_.add(CommRecord{log_.step(), "recv", inner_->axis(), size_, bytes_of(count, t), false, t0 - o, t2 - o, t2 - t0,
                      t1 - t0, t1 - o, t2 - o, peer, tag});
}

void ProfiledCommunicator::probe(int peer, int tag) { inner_->probe(peer, tag); }

void ProfiledCommunicator::barrier() {
  blocking("barrier", 0, [&] { inner_->barrier(); });
}

RequestPtr ProfiledCommunicator::iall_reduce(void* buf, std::int64_t count, DType t, ReduceOp op) {
  return nonblocking("all_reduce", bytes_of(count, t), [&] { return inner_->iall_reduce(buf, count, t, op); });
}

RequestPtr ProfiledCommunicator::ireduce_scatter(const void* send, void* recv, std::int64_t recv_count, DType t,
                                                 ReduceOp op) {
  return nonblocking("reduce_scatter", bytes_of(recv_count * size_, t),
                     [&] { return inner_->ireduce_scatter(send, recv, recv_count, t, op); });
}

RequestPtr ProfiledCommunicator::iall_gather(const void* send, void* recv, std::int64_t send_count, DType t) {
  return nonblocking("all_gather", bytes_of(send_count * size_, t),
                     [&] { return inner_->iall_gather(send, recv, send_count, t); });
}

RequestPtr ProfiledCommunicator::ibroadcast(void* buf, std::int64_t count, DType t, int root) {
  return nonblocking("broadcast", bytes_of(count, t), [&] { return inner_->ibroadcast(buf, count, t, root); });
}

RequestPtr ProfiledCommunicator::isend(const void* buf, std::int64_t count, DType t, int peer, int tag) {
  return nonblocking("send", bytes_of(count, t), [&] { return inner_->isend(buf, count, t, peer, tag); }, peer, tag);
}

RequestPtr ProfiledCommunicator::irecv(void* buf, std::int64_t count, DType t, int peer, int tag) {
  return nonblocking("recv", bytes_of(count, t), [&] { return inner_->irecv(buf, count, t, peer, tag); }, peer, tag);
}

}  // namespace strata::comm
