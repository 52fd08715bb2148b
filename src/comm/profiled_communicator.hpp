// The profiling decorator: wraps any communicator and appends one CommRecord
// per call to the rank's CommLog (the report's /comm table). The cost per call
// is two clock reads and one vector push, so profiling can stay on.
#pragma once

#include <memory>
#include <string>
#include <vector>

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

#define STRATA_COMM_OP(ret, name, params) ret name params override;
#include "kernels/foundation/comm_ops.inc"
#undef STRATA_COMM_OP
  bool last_device_span(double* start, double* end) const override { return inner_->last_device_span(start, end); }

 private:
  // Runs a blocking call and records it; the whole call counts as waiting.
  template <typename F>
  void blocking(const char* op, std::int64_t bytes, F&& call, int peer = -1, int tag = -1);
  // Issues a non-blocking call; its record is completed by the returned request.
  template <typename F>
  RequestPtr nonblocking(const char* op, std::int64_t bytes, F&& call, int peer = -1, int tag = -1);

  std::unique_ptr<Communicator> inner_;
  CommLog& log_;
  int rank_, size_;
};

}  // namespace strata::comm
