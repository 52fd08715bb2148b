// The process mesh: rank <-> (pp, dp, tp) with tp fastest, and one profiled
// communicator per axis (and per split of dp: ep/edp, dp_shard/dp_replica) (MPI, staged MPI or NCCL, each on an MPI
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
  Layout l{p.parallel.pp, p.parallel.dp, p.parallel.tp, p.parallel.ep, p.parallel.dp_shard};
  if (l.pp > 1) {
    const strategies::pp::Shape s{l.pp, p.micro_batches(), p.parallel.virtual_stages};
    const auto& place = *p.parallel.schedule->placement;
    l.emb_first = place.rank_of(s, 0);
    l.emb_last = place.rank_of(s, s.p * s.v - 1);
  }
  return l;
}

std::string describe(const Layout& l) {
  return fmt::format("pp {} x dp {} x tp {}{}{}", l.pp, l.dp, l.tp, l.ep > 1 ? fmt::format(" (ep {})", l.ep) : "",
                     l.shard() < l.dp ? fmt::format(" (dp_shard {})", l.shard()) : "");
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

enum class Axis { dp, tp, pp, ep, edp, shard, replica };

// World ranks of the group along `axis` through `c`, in group-rank order.
// ep and dp_shard cut each dp group into blocks of k consecutive ranks: the
// block through c (ep, shard), or the ranks at c's place in every block
// (edp, replica).
std::vector<int> group_members(const Layout& l, Coords c, Axis axis) {
  std::vector<int> out;
  const bool block = axis == Axis::ep || axis == Axis::shard, across = axis == Axis::edp || axis == Axis::replica;
  const int k = axis == Axis::ep || axis == Axis::edp ? l.ep : l.shard();
  const int n = axis == Axis::dp ? l.dp : axis == Axis::tp ? l.tp : axis == Axis::pp ? l.pp : block ? k : l.dp / k;
  const int base = c.dp / k * k, place = c.dp % k;
  for (int i = 0; i < n; ++i) {
    if (block)
      c.dp = base + i;
    else if (across)
      c.dp = i * k + place;
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
  if (axis == "dp_shard") return group_members(l, c, Axis::shard);
  if (axis == "dp_replica") return group_members(l, c, Axis::replica);
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
  if (l.dp_shard < 0 || l.dp % l.shard() != 0)
    core::runtime_error("mesh: dp_shard {} does not divide dp {}: hybrid sharding splits each data-parallel group",
                        l.dp_shard, l.dp);
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
    // dp_shard: the same (pp, tp) and dp / S; dp_replica: the same (pp, tp) and dp % S.
    const int S = l.shard();
    shard_comm_ = split(world_comm_, (c.pp * (l.dp / S) + c.dp / S) * l.tp + c.tp, c.dp % S);
    replica_comm_ = split(world_comm_, (c.pp * S + c.dp % S) * l.tp + c.tp, c.dp / S);
    world_ = profiled(backend, world_comm_, "world", log);
    if (emb_comm_ != MPI_COMM_NULL) emb_ = profiled(backend, emb_comm_, "emb", log);
    dp_ = profiled(backend, dp_comm_, "dp", log);
    tp_ = profiled(backend, tp_comm_, "tp", log);
    pp_ = profiled(backend, pp_comm_, "pp", log);
    ep_ = profiled(backend, ep_comm_, "ep", log);
    edp_ = profiled(backend, edp_comm_, "edp", log);
    shard_ = profiled(backend, shard_comm_, "dp_shard", log);
    replica_ = profiled(backend, replica_comm_, "dp_replica", log);
  } catch (...) {
    // The destructor does not run for a half-built object.
    release();
    throw;
  }
}

Mesh::Mesh(const Layout& l, int rank, comm::CommLog& log) : layout_(l), backend_(comm::Backend::meta), rank_(rank) {
  if (l.pp < 1 || l.dp < 1 || l.tp < 1 || l.ep < 1 || l.dp % l.ep != 0 || l.dp_shard < 0 || l.dp % l.shard() != 0)
    core::runtime_error("mesh: layout pp {} x dp {} x tp {} (ep {}, dp_shard {}) is not a mesh", l.pp, l.dp, l.tp,
                        l.ep, l.dp_shard);
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
  shard_ = meta("dp_shard", l.shard(), c.dp % l.shard());
  replica_ = meta("dp_replica", l.dp / l.shard(), c.dp / l.shard());
}

void Mesh::release() {
  world_.reset(), dp_.reset(), tp_.reset(), pp_.reset(), emb_.reset(), ep_.reset(), edp_.reset(), shard_.reset(),
      replica_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // the handles died with MPI
  free_comm(replica_comm_), free_comm(shard_comm_), free_comm(edp_comm_), free_comm(ep_comm_);
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

std::string layout_table(const Layout& l, const std::vector<std::string>& hosts) {
  const int n = l.world();
  // The group columns: dp, tp and pp always; the splits of dp where they
  // divide it.
  struct Column {
    const char* header;
    const char* name;
    Axis axis;
  };
  std::vector<Column> cols = {{"dp group", "dp", Axis::dp}, {"tp group", "tp", Axis::tp}, {"pp group", "pp", Axis::pp}};
  if (l.ep > 1) cols.insert(cols.end(), {{"ep group", "ep", Axis::ep}, {"edp group", "edp", Axis::edp}});
  if (l.shard() < l.dp)
    cols.insert(cols.end(), {{"shard group", "dp_shard", Axis::shard}, {"replica group", "dp_replica", Axis::replica}});
  std::vector<std::vector<std::string>> cells(static_cast<std::size_t>(n));
  std::vector<std::size_t> width;
  for (const Column& c : cols) width.push_back(std::string_view(c.header).size());
  std::size_t wh = 4;
  for (int r = 0; r < n; ++r) {
    for (std::size_t k = 0; k < cols.size(); ++k) {
      cells[std::size_t(r)].push_back(group_text(cols[k].name, group_members(l, coords_of(l, r), cols[k].axis)));
      width[k] = std::max(width[k], cells[std::size_t(r)].back().size());
    }
    if (!hosts.empty()) wh = std::max(wh, hosts[std::size_t(r)].size());
  }
  const std::size_t wr = std::max<std::size_t>(4, fmt::formatted_size("{}", n - 1));
  const std::size_t wc = std::max<std::size_t>(2, fmt::formatted_size("{}", std::max({l.pp, l.dp, l.tp}) - 1));
  auto line = [&](const std::string& rank, const std::string& host, const std::string& pp, const std::string& dp,
                  const std::string& tp, const std::vector<std::string>& groups) {
    std::string s = fmt::format("{:>{}}  {:<{}}  {:>{}}  {:>{}}  {:>{}}", rank, wr, host, wh, pp, wc, dp, wc, tp, wc);
    for (std::size_t k = 0; k < groups.size(); ++k)
      s += k + 1 < groups.size() ? fmt::format("  {:<{}}", groups[k], width[k]) : "  " + groups[k];
    return s + "\n";
  };
  std::vector<std::string> headers;
  for (const Column& c : cols) headers.emplace_back(c.header);
  std::string out = line("rank", "host", "pp", "dp", "tp", headers);
  for (int r = 0; r < n; ++r) {
    const Coords c = coords_of(l, r);
    out += line(std::to_string(r), hosts.empty() ? "-" : hosts[std::size_t(r)], std::to_string(c.pp),
                std::to_string(c.dp), std::to_string(c.tp), cells[std::size_t(r)]);
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
  if (axis == "dp_shard") return shard_comm_;
  if (axis == "dp_replica") return replica_comm_;
  return MPI_COMM_NULL;
}

}  // namespace strata::mesh
