// STRATA_CHECK_MPI: MPI return codes are checked, never ignored. A failing
// call becomes a runtime strata::core::Error naming the call, the place and
// MPI's own text for the code. Header-only so any layer that talks MPI can use it.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "kernels/foundation/error.hpp"

namespace strata::comm {

// Codes are only returned (rather than aborting inside MPI) where the
// communicator's error handler is MPI_ERRORS_RETURN; the check is right either way.
[[noreturn]] inline void mpi_failed(int code, const char* expr, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  core::runtime_error("MPI call `{}` failed at {}:{}: {} (code {})", expr, file, line,
                      len > 0 ? std::string(text, len) : std::string("unknown error"), code);
}

}  // namespace strata::comm

#define STRATA_CHECK_MPI(expr)                                                      \
  do {                                                                              \
    const int strata_mpi_rc_ = (expr);                                              \
    if (strata_mpi_rc_ != MPI_SUCCESS)                                              \
      ::strata::comm::mpi_failed(strata_mpi_rc_, #expr, __FILE__, __LINE__);        \
  } while (0)

namespace strata::comm {

// Rank `root`'s `text` on every rank of `comm` (collective; other ranks'
// `text` is ignored): a deck read on rank 0, a verdict's message.
inline std::string broadcast_string(const std::string& text, MPI_Comm comm, int root = 0) {
  long long n = static_cast<long long>(text.size());
  STRATA_CHECK_MPI(MPI_Bcast(&n, 1, MPI_LONG_LONG, root, comm));
  std::vector<char> buf(text.begin(), text.end());
  buf.resize(static_cast<std::size_t>(n));
  STRATA_CHECK_MPI(MPI_Bcast(buf.data(), static_cast<int>(n), MPI_CHAR, root, comm));
  return std::string(buf.begin(), buf.end());
}

// Each rank's error (`mine`, empty for none) agreed on (collective): the
// lowest failing rank and its message on every rank, rank -1 when none
// failed. What lets ranks that found an error at one point fail together
// instead of one going ahead to a collective the others never reach.
struct Failure {
  int rank = -1;
  std::string message;
};
inline Failure first_failure(const std::string& mine, MPI_Comm comm) {
  int rank = 0, size = 1;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  STRATA_CHECK_MPI(MPI_Comm_size(comm, &size));
  int first = mine.empty() ? size : rank;
  STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm));
  if (first == size) return {};
  return {first, broadcast_string(mine, comm, first)};
}

// This rank's place among the ranks of `comm` that share its node
// (collective): where GPUs are handed out and a node's ranks counted.
struct NodePlace {
  int local = 0;  // rank among them
  int size = 1;   // how many
};
inline NodePlace node_place(MPI_Comm comm) {
  MPI_Comm node = MPI_COMM_NULL;
  STRATA_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  NodePlace p;
  STRATA_CHECK_MPI(MPI_Comm_rank(node, &p.local));
  STRATA_CHECK_MPI(MPI_Comm_size(node, &p.size));
  STRATA_CHECK_MPI(MPI_Comm_free(&node));
  return p;
}

}  // namespace strata::comm
