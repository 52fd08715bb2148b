// The MPI implementation of the communicator: each call maps onto one MPI-3
// collective or point-to-point call on a communicator it does not own (the
// Mesh owns and frees it). Every return code is checked with STRATA_CHECK_MPI.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "kernels/foundation/communicator.hpp"

namespace strata::comm {

MPI_Datatype mpi_datatype(DType t);
MPI_Op mpi_op(ReduceOp op, DType t);

class MpiCommunicator : public Communicator {
 public:
  // `comm` stays owned by the caller and must outlive this object. Codes are
  // only returned (and turned into exceptions) if `comm`'s error handler is
  // MPI_ERRORS_RETURN; the Mesh sets it on every communicator it creates.
  MpiCommunicator(MPI_Comm comm, std::string axis);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& axis() const override { return axis_; }
  MPI_Comm comm() const { return comm_; }

#define STRATA_COMM_OP(ret, name, params) ret name params override;
#include "kernels/foundation/comm_ops.inc"
#undef STRATA_COMM_OP

 private:
  // True when send is this rank's block of recv, so MPI_IN_PLACE applies.
  bool gather_in_place(const void* send, const void* recv, std::int64_t send_count, DType t) const;

  MPI_Comm comm_;
  std::string axis_;
  int rank_ = 0, size_ = 1;
  // all_to_allv's int counts and displacements, kept so a call does not allocate.
  std::vector<int> sc_, sd_, rc_, rd_;
};

}  // namespace strata::comm
