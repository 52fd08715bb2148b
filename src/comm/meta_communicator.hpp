// The communicator of the meta device (a dry run): a group of `size` ranks in
// which this process plays rank `rank`, and no other rank exists. Every
// operation returns at once without moving anything; non-blocking ones
// return complete requests. Wrapped in the profiling decorator, it records
// exactly the calls, sizes and axes a real rank of that position would
// issue, since the same code issues them; a dry run's trace gets them too.
#pragma once

#include <string>

#include "kernels/foundation/communicator.hpp"

namespace strata::comm {

class MetaCommunicator : public Communicator {
 public:
  MetaCommunicator(std::string axis, int size, int rank);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& axis() const override { return axis_; }

#define STRATA_COMM_OP(ret, name, params) ret name params override;
#include "kernels/foundation/comm_ops.inc"
#undef STRATA_COMM_OP

 private:
  // Records the call in the thread's trace, if any; returns its index there.
  int record(const char* op, std::int64_t bytes, bool nonblocking = false, int peer = -1, int tag = 0) const;
  RequestPtr request(const char* op, std::int64_t bytes, int peer = -1, int tag = 0) const;
  std::string axis_;
  int size_, rank_;
};

}  // namespace strata::comm
