// The process mesh: rank <-> (pp, dp, tp) with tp fastest, and one profiled
// communicator per axis (MPI, staged MPI or NCCL, each on an MPI
// communicator split from a private duplicate of the world, so the mesh's
// traffic never matches messages of other code on the same world).
#include "src/mesh/mesh.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "src/comm/meta_communicator.hpp"
#include "src/comm/mpi_check.hpp"
#include "src/comm/profiled_communicator.hpp"
#include "kernels/foundation/error.hpp"

namespace strata::mesh {

Layout layout_of(const plan::Plan& p) {
  Layout l{p.parallel.pp, p.parallel.dp, p.parallel.tp, p.parallel.ep};
  if (l.pp > 1) {
    const strategies::pp::Shape s{l.pp, p.micro_batches(), p.parallel.virtual_stages};
    const auto& place = *p.parallel.schedule->placement;
    l.emb_first = place.rank_of(s, 0);
    l.emb_last = place.rank_of(s, s.p * s.v - 1);
  }
  return l;
}

Coords coords_of(const Layout& l, int rank) {
  STRATA_CHECK(rank >= 0 && rank < l.world(), "rank {} outside a world of {}", rank, l.world());
  return Coords{rank / (l.tp * l.dp), (rank / l.tp) % l.dp, rank % l.tp};
}

int rank_of(const Layout& l, const Coords& c) {
  STRATA_CHECK(c.pp >= 0 && c.pp < l.pp && c.dp >= 0 && c.dp < l.dp && c.tp >= 0 && c.tp < l.tp,
               "coordinates (pp {}, dp {}, tp {}) outside layout pp {} x dp {} x tp {}", c.pp, c.dp, c.tp, l.pp, l.dp,
               l.tp);
  return (c.pp * l.dp + c.dp) * l.tp + c.tp;
}

namespace {

enum class Axis { dp, tp, pp, ep, edp };

// World ranks of the group along `axis` through `c`, in group-rank order.
std::vector<int> group_members(const Layout& l, Coords c, Axis axis) {
  std::vector<int> out;
  const int n = axis == Axis::dp ? l.dp : axis == Axis::tp ? l.tp : axis == Axis::pp ? l.pp : axis == Axis::ep ? l.ep
                                                                                                    : l.dp / l.ep;
  const int ep_base = c.dp / l.ep * l.ep, ep_coord = c.dp % l.ep;
  for (int i = 0; i < n; ++i) {
    if (axis == Axis::ep)
      c.dp = ep_base + i;
    else if (axis == Axis::edp)
      c.dp = i * l.ep + ep_coord;
    else
      (axis == Axis::dp ? c.dp : axis == Axis::tp ? c.tp : c.pp) = i;
    out.push_back(rank_of(l, c));
  }
  return out;
}

}  // namespace

std::vector<int> group_ranks(const Layout& l, const std::string& axis, int rank) {
  const Coords c = coords_of(l, rank);
  if (axis == "dp") return group_members(l, c, Axis::dp);
  if (axis == "tp") return group_members(l, c, Axis::tp);
  if (axis == "pp") return group_members(l, c, Axis::pp);
  if (axis == "ep") return group_members(l, c, Axis::ep);
  if (axis == "edp") return group_members(l, c, Axis::edp);
  if (axis == "emb") {
    const Coords first{l.emb_first, c.dp, c.tp}, last{l.last_stage_rank(), c.dp, c.tp};
    if (l.emb_first == l.last_stage_rank()) return {rank_of(l, first)};
    return {rank_of(l, first), rank_of(l, last)};
  }
  std::vector<int> all(std::size_t(l.world()));
  for (int r = 0; r < l.world(); ++r) all[std::size_t(r)] = r;
  return all;
}

namespace {

// "dp{0,2}"; a group is an arithmetic progression of ranks, so long ones are
// shortened to "dp{0,2,..,30}" and a table for thousands of ranks stays readable.
std::string group_text(const char* name, const std::vector<int>& m) {
  std::string s = fmt::format("{}{{", name);
  if (m.size() <= 4) {
    for (std::size_t i = 0; i < m.size(); ++i) s += fmt::format("{}{}", i ? "," : "", m[i]);
  } else {
    s += fmt::format("{},{},..,{}", m[0], m[1], m.back());
  }
  return s + "}";
}

// MPI_Comm_split by colour (the other coordinates) with key (this axis's
// coordinate), so the group rank equals the coordinate along the axis.
MPI_Comm split(MPI_Comm world, int color, int key) {
  MPI_Comm c = MPI_COMM_NULL;
  STRATA_CHECK_MPI(MPI_Comm_split(world, color, key, &c));
  if (c != MPI_COMM_NULL) STRATA_CHECK_MPI(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
  return c;
}

std::unique_ptr<comm::Communicator> profiled(comm::Backend b, MPI_Comm c, const char* axis, comm::CommLog& log) {
  return std::make_unique<comm::ProfiledCommunicator>(comm::make_communicator(b, c, axis), log);
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
  // Every rank sees the same size and layout, so every rank throws here
  // together and none is left waiting in the splits below.
  if (l.pp < 1 || l.dp < 1 || l.tp < 1 || l.ep < 1)
    core::runtime_error("mesh: layout pp {} x dp {} x tp {} (ep {}) has an axis below 1", l.pp, l.dp, l.tp, l.ep);
  if (l.dp % l.ep != 0)
    core::runtime_error("mesh: ep {} does not divide dp {}: expert parallelism splits each data-parallel group", l.ep,
                        l.dp);
  if (l.world() != size)
    core::runtime_error("mesh: layout pp {} x dp {} x tp {} = {} rank(s), but the world has {}: need pp*dp*tp == world",
                        l.pp, l.dp, l.tp, l.world(), size);
  if (!comm::backend_built(backend))
    core::runtime_error("mesh: communicator backend \"{}\" needs the CUDA backend, which this build lacks (configure "
                        "with -DSTRATA_WITH_CUDA=ON, or AUTO where nvcc is found)",
                        comm::describe_backend(backend));
  coords_ = coords_of(l, rank_);
  const Coords& c = coords_;
  try {
    STRATA_CHECK_MPI(MPI_Comm_dup(world, &world_comm_));
    STRATA_CHECK_MPI(MPI_Comm_set_errhandler(world_comm_, MPI_ERRORS_RETURN));
    dp_comm_ = split(world_comm_, c.pp * l.tp + c.tp, c.dp);
    tp_comm_ = split(world_comm_, c.pp * l.dp + c.dp, c.tp);
    pp_comm_ = split(world_comm_, c.dp * l.tp + c.tp, c.pp);
    // The first and last pipeline stages of each (dp, tp) position: the two
    // holders of the tied word embedding.
    emb_comm_ = split(world_comm_, l.in_emb_group(c.pp) ? c.dp * l.tp + c.tp : MPI_UNDEFINED, c.pp);
    // ep: the same (pp, tp) and dp / ep; edp: the same (pp, tp) and dp % ep.
    const int groups = l.dp / l.ep;
    ep_comm_ = split(world_comm_, (c.pp * groups + c.dp / l.ep) * l.tp + c.tp, c.dp % l.ep);
    edp_comm_ = split(world_comm_, (c.pp * l.ep + c.dp % l.ep) * l.tp + c.tp, c.dp / l.ep);
    world_ = profiled(backend, world_comm_, "world", log);
    if (emb_comm_ != MPI_COMM_NULL) emb_ = profiled(backend, emb_comm_, "emb", log);
    dp_ = profiled(backend, dp_comm_, "dp", log);
    tp_ = profiled(backend, tp_comm_, "tp", log);
    pp_ = profiled(backend, pp_comm_, "pp", log);
    ep_ = profiled(backend, ep_comm_, "ep", log);
    edp_ = profiled(backend, edp_comm_, "edp", log);
  } catch (...) {
    // The destructor does not run for a half-built object.
    release();
    throw;
  }
}

Mesh::Mesh(const Layout& l, int rank, comm::CommLog& log) : layout_(l), backend_(comm::Backend::meta), rank_(rank) {
  if (l.pp < 1 || l.dp < 1 || l.tp < 1 || l.ep < 1 || l.dp % l.ep != 0)
    core::runtime_error("mesh: layout pp {} x dp {} x tp {} (ep {}) is not a mesh", l.pp, l.dp, l.tp, l.ep);
  coords_ = coords_of(l, rank);
  const Coords& c = coords_;
  auto meta = [&](const char* axis, int size, int r) -> std::unique_ptr<comm::Communicator> {
    return std::make_unique<comm::ProfiledCommunicator>(std::make_unique<comm::MetaCommunicator>(axis, size, r), log);
  };
  world_ = meta("world", l.world(), rank);
  if (l.in_emb_group(c.pp)) emb_ = meta("emb", 2, c.pp == l.emb_first ? 0 : 1);
  dp_ = meta("dp", l.dp, c.dp);
  tp_ = meta("tp", l.tp, c.tp);
  pp_ = meta("pp", l.pp, c.pp);
  ep_ = meta("ep", l.ep, c.dp % l.ep);
  edp_ = meta("edp", l.dp / l.ep, c.dp / l.ep);
}

void Mesh::release() {
  world_.reset(), dp_.reset(), tp_.reset(), pp_.reset(), emb_.reset(), ep_.reset(), edp_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // the handles died with MPI
  free_comm(edp_comm_), free_comm(ep_comm_);
  free_comm(emb_comm_), free_comm(pp_comm_), free_comm(tp_comm_), free_comm(dp_comm_), free_comm(world_comm_);
}

Mesh::~Mesh() { release(); }

std::string Mesh::table() const {
  const int n = layout_.world();
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  STRATA_CHECK_MPI(MPI_Get_processor_name(name, &len));
  std::vector<char> all(std::size_t(n) * MPI_MAX_PROCESSOR_NAME);
  // Raw MPI, not the profiled world: setup traffic is not part of a step.
  STRATA_CHECK_MPI(
      MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, world_comm_));
  std::vector<std::string> hosts;
  for (int r = 0; r < n; ++r) {
    const char* h = &all[std::size_t(r) * MPI_MAX_PROCESSOR_NAME];
    hosts.emplace_back(h, strnlen(h, MPI_MAX_PROCESSOR_NAME));
  }
  return layout_table(layout_, hosts);
}

std::string layout_table(const Layout& layout, const std::vector<std::string>& hosts) {
  const Layout& layout_ = layout;
  const int n = layout_.world();
  struct Row {
    std::string host, dp, tp, pp, ep, edp;
    Coords c;
  };
  const bool ep = layout_.ep > 1;  // the ep group's column only when there is one
  std::vector<Row> rows(n);
  std::size_t wh = 4, wd = 8, wt = 8, wp = 8, we = 8;  // at least the headers' widths
  for (int r = 0; r < n; ++r) {
    Row& row = rows[r];
    row.c = coords_of(layout_, r);
    row.host = hosts.empty() ? "-" : hosts[std::size_t(r)];
    row.dp = group_text("dp", group_members(layout_, row.c, Axis::dp));
    row.tp = group_text("tp", group_members(layout_, row.c, Axis::tp));
    row.pp = group_text("pp", group_members(layout_, row.c, Axis::pp));
    if (ep) {
      row.ep = group_text("ep", group_members(layout_, row.c, Axis::ep));
      row.edp = group_text("edp", group_members(layout_, row.c, Axis::edp));
      we = std::max(we, row.ep.size());
    }
    wh = std::max(wh, row.host.size());
    wd = std::max(wd, row.dp.size());
    wt = std::max(wt, row.tp.size());
    wp = std::max(wp, row.pp.size());
  }
  const std::size_t wr = std::max<std::size_t>(4, fmt::formatted_size("{}", n - 1));
  const std::size_t wc =
      std::max<std::size_t>(2, fmt::formatted_size("{}", std::max({layout_.pp, layout_.dp, layout_.tp}) - 1));
  std::string out = fmt::format("{:>{}}  {:<{}}  {:>{}}  {:>{}}  {:>{}}  {:<{}}  {:<{}}  {}\n", "rank", wr, "host", wh,
                                "pp", wc, "dp", wc, "tp", wc, "dp group", wd, "tp group", wt,
                                ep ? fmt::format("{:<{}}  {:<{}}  edp group", "pp group", wp, "ep group", we)
                                   : std::string("pp group"));
  for (int r = 0; r < n; ++r) {
    const Row& row = rows[r];
    out += fmt::format("{:>{}}  {:<{}}  {:>{}}  {:>{}}  {:>{}}  {:<{}}  {:<{}}  {}\n", r, wr, row.host, wh, row.c.pp,
                       wc, row.c.dp, wc, row.c.tp, wc, row.dp, wd, row.tp, wt,
                       ep ? fmt::format("{:<{}}  {:<{}}  {}", row.pp, wp, row.ep, we, row.edp) : row.pp);
  }
  return out;
}

MPI_Comm Mesh::mpi_comm(std::string_view axis) const {
  if (axis == "world") return world_comm_;
  if (axis == "emb") return emb_comm_;
  if (axis == "dp") return dp_comm_;
  if (axis == "tp") return tp_comm_;
  if (axis == "pp") return pp_comm_;
  if (axis == "ep") return ep_comm_;
  if (axis == "edp") return edp_comm_;
  return MPI_COMM_NULL;
}

}  // namespace strata::mesh
