// The profiling decorator: wraps any communicator and appends one CommRecord
// per call to the rank's CommLog (the report's /comm table). The cost per call
// is two clock reads and one vector push, so profiling can stay on.
#pragma once

#include <memory>
#include <string>

#include "src/comm/comm_log.hpp"
#include "kernels/foundation/communicator.hpp"

namespace strata::comm {

class ProfiledCommunicator : public Communicator {
 public:
  // `log` must outlive this communicator and every request it returns.
  ProfiledCommunicator(std::unique_ptr<Communicator> inner, CommLog& log);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& axis() const override { return inner_->axis(); }
  Communicator& inner() { return *inner_; }

  void all_reduce(void* buf, std::int64_t count, DType t, ReduceOp op) override;
  void reduce_scatter(const void* send, void* recv, std::int64_t recv_count, DType t, ReduceOp op) override;
  void all_gather(const void* send, void* recv, std::int64_t send_count, DType t) override;
  void broadcast(void* buf, std::int64_t count, DType t, int root) override;
  void all_to_all(const void* send, void* recv, std::int64_t count_per_peer, DType t) override;
  void all_to_allv(const void* send, const std::int64_t* send_counts, const std::int64_t* send_displs, void* recv,
                   const std::int64_t* recv_counts, const std::int64_t* recv_displs, DType t) override;
  void send(const void* buf, std::int64_t count, DType t, int peer, int tag) override;
  void recv(void* buf, std::int64_t count, DType t, int peer, int tag) override;
  void probe(int peer, int tag) override;
  void barrier() override;

  RequestPtr iall_reduce(void* buf, std::int64_t count, DType t, ReduceOp op) override;
  RequestPtr ireduce_scatter(const void* send, void* recv, std::int64_t recv_count, DType t, ReduceOp op) override;
  RequestPtr iall_gather(const void* send, void* recv, std::int64_t send_count, DType t) override;
  RequestPtr ibroadcast(void* buf, std::int64_t count, DType t, int root) override;
  RequestPtr isend(const void* buf, std::int64_t count, DType t, int peer, int tag) override;
  RequestPtr irecv(void* buf, std::int64_t count, DType t, int peer, int tag) override;
  bool last_device_span(double* start, double* end) const override { return inner_->last_device_span(start, end); }

 private:
  // Runs a blocking call and records it; the whole call counts as waiting.
  template <typename F>
  void blocking(const char* op, std::int64_t bytes, F&& call);
  // Issues a non-blocking call; its record is completed by the returned request.
  template <typename F>
  RequestPtr nonblocking(const char* op, std::int64_t bytes, F&& call);

  std::unique_ptr<Communicator> inner_;
  CommLog& log_;
  int rank_, size_;
};

}  // namespace strata::comm
