// The process mesh: one profiled communicator per group of the layout (MPI,
// staged MPI or NCCL), each on an MPI communicator split from a private
// duplicate of the world, so the mesh's traffic never matches messages of
// other code on the same world.
#include "src/mesh/mesh.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/foundation/error.hpp"
#include "src/comm/meta_communicator.hpp"
#include "src/comm/mpi_check.hpp"
#include "src/comm/profiled_communicator.hpp"

namespace strata::mesh {

namespace {

// MPI_Comm_split by colour (the group's first member) with key (the rank's
// place in the group), so the group rank is the position group_ranks gives.
MPI_Comm split(MPI_Comm world, int color, int key) {
  MPI_Comm c = MPI_COMM_NULL;
  STRATA_CHECK_MPI(MPI_Comm_split(world, color, key, &c));
  if (c != MPI_COMM_NULL) STRATA_CHECK_MPI(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
  return c;
}

void free_comm(MPI_Comm& c) {
  if (c != MPI_COMM_NULL) MPI_Comm_free(&c);  // best effort: called from a destructor or while unwinding
  c = MPI_COMM_NULL;
}

}  // namespace

Mesh::Mesh(MPI_Comm world, const Layout& l, comm::CommLog& log, comm::Backend backend)
    : layout_(l), backend_(backend) {
  int size = 0;
  STRATA_CHECK_MPI(MPI_Comm_size(world, &size));
  STRATA_CHECK_MPI(MPI_Comm_rank(world, &rank_));
  // Checked the same on every rank (each sees the same layout), so that
  // every rank throws together and none is left waiting in a split.
  check_layout(l);
  if (l.world() != size)
    core::runtime_error("mesh: layout {} = {} rank(s), but the world has {}: the product of its dims must be the "
                        "world",
                        describe(l), l.world(), size);
  if (!comm::backend_built(backend))
    core::runtime_error("mesh: communicator backend \"{}\" needs the CUDA backend, which this build lacks (configure "
                        "with -DSTRATA_WITH_CUDA=ON, or AUTO where nvcc is found)",
                        comm::describe_backend(backend));
  coords_ = coords_of(l, rank_);
  try {
    Axis& w = axes_.emplace_back();
    w.name = "world";
    STRATA_CHECK_MPI(MPI_Comm_dup(world, &w.comm));
    STRATA_CHECK_MPI(MPI_Comm_set_errhandler(w.comm, MPI_ERRORS_RETURN));
    for (const std::string& name : l.axis_names()) {
      if (name == "world") continue;
      Axis& a = axes_.emplace_back();
      a.name = name;
      const std::vector<int> m = group_ranks(l, name, rank_);
      const int key = int(std::find(m.begin(), m.end(), rank_) - m.begin());
      a.comm = split(axes_.front().comm, m.empty() ? MPI_UNDEFINED : m.front(), key);
    }
    for (Axis& a : axes_)
      if (a.comm != MPI_COMM_NULL)
        a.group = std::make_unique<comm::ProfiledCommunicator>(comm::make_communicator(backend, a.comm, a.name.c_str()), log);
  } catch (...) {
    // The destructor does not run for a half-built object.
    release();
    throw;
  }
}

Mesh::Mesh(const Layout& l, int rank, comm::CommLog& log) : layout_(l), backend_(comm::Backend::meta), rank_(rank) {
  check_layout(l);
  coords_ = coords_of(l, rank);
  for (const std::string& name : l.axis_names()) {
    Axis& a = axes_.emplace_back();
    a.name = name;
    int size = l.world(), place = rank;  // the world's: every rank, in order
    if (name != "world") {
      const std::vector<int> m = group_ranks(l, name, rank);
      if (m.empty()) continue;
      size = int(m.size()), place = int(std::find(m.begin(), m.end(), rank) - m.begin());
    }
    a.group = std::make_unique<comm::ProfiledCommunicator>(
        std::make_unique<comm::MetaCommunicator>(a.name.c_str(), size, place), log);
  }
}

void Mesh::release() {
  for (Axis& a : axes_) a.group.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // the handles died with MPI
  // Groups before the world they were split from.
  for (auto a = axes_.rbegin(); a != axes_.rend(); ++a) free_comm(a->comm);
}

Mesh::~Mesh() { release(); }

int Mesh::coord(std::string_view dim) const {
  const int i = layout_.dim_index(dim);
  return i < 0 ? 0 : coords_[std::size_t(i)];
}

comm::Communicator* Mesh::group(std::string_view name) const {
  for (const Axis& a : axes_)
    if (a.name == name) return a.group.get();
  return nullptr;
}

comm::Communicator& Mesh::axis(std::string_view name) const {
  comm::Communicator* c = group(name);
  STRATA_CHECK(c != nullptr, "rank {} has no '{}' group", rank_, name);
  return *c;
}

std::string Mesh::table() const {
  const int n = layout_.world();
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  STRATA_CHECK_MPI(MPI_Get_processor_name(name, &len));
  std::vector<char> all(std::size_t(n) * MPI_MAX_PROCESSOR_NAME);
  // Raw MPI, not the profiled world: setup traffic is not part of a step.
  STRATA_CHECK_MPI(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                                 axes_.front().comm));
  std::vector<std::string> hosts;
  for (int r = 0; r < n; ++r) {
    const char* h = &all[std::size_t(r) * MPI_MAX_PROCESSOR_NAME];
    hosts.emplace_back(h, strnlen(h, MPI_MAX_PROCESSOR_NAME));
  }
  return layout_table(layout_, hosts);
}

MPI_Comm Mesh::mpi_comm(std::string_view axis) const {
  for (const Axis& a : axes_)
    if (a.name == axis) return a.comm;
  return MPI_COMM_NULL;
}

}  // namespace strata::mesh
