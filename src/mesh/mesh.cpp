// The process mesh: rank <-> (pp, dp, tp) with tp fastest, and one profiled
// communicator per axis (cp, dp x cp, and the splits of dp: ep/edp,
// dp_shard/dp_replica) (MPI, staged MPI or NCCL, each on an MPI
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
  Layout l{p.parallel.pp, p.parallel.dp, p.parallel.tp, p.parallel.ep, p.parallel.dp_shard, p.parallel.cp};
  if (l.pp > 1) {
    const strategies::pp::Shape s{l.pp, p.micro_batches(), p.parallel.virtual_stages};
    const auto& place = *p.parallel.schedule->placement;
    l.emb_first = place.rank_of(s, 0);
    l.emb_last = place.rank_of(s, s.p * s.v - 1);
  }
  return l;
}

std::string describe(const Layout& l) {
  return fmt::format("pp {} x dp {} x {}tp {}{}{}", l.pp, l.dp, l.cp > 1 ? fmt::format("cp {} x ", l.cp) : "", l.tp,
                     l.ep > 1 ? fmt::format(" (ep {})", l.ep) : "",
                     l.shard() < l.dp ? fmt::format(" (dp_shard {})", l.shard()) : "");
}

Coords coords_of(const Layout& l, int rank) {
  STRATA_CHECK(rank >= 0 && rank < l.world(), "rank {} outside a world of {}", rank, l.world());
  return Coords{rank / (l.tp * l.cp * l.dp), (rank / (l.tp * l.cp)) % l.dp, rank % l.tp, (rank / l.tp) % l.cp};
}

int rank_of(const Layout& l, const Coords& c) {
  STRATA_CHECK(c.pp >= 0 && c.pp < l.pp && c.dp >= 0 && c.dp < l.dp && c.tp >= 0 && c.tp < l.tp && c.cp >= 0 &&
                   c.cp < l.cp,
               "coordinates (pp {}, dp {}, cp {}, tp {}) outside layout {}", c.pp, c.dp, c.cp, c.tp, describe(l));
  return ((c.pp * l.dp + c.dp) * l.cp + c.cp) * l.tp + c.tp;
}

namespace {

enum class Axis { dp, tp, pp, cp, dp_cp, ep, edp, shard, replica };

// World ranks of the group along `axis` through `c`, in group-rank order.
// ep and dp_shard cut each dp group into blocks of k consecutive ranks: the
// block through c (ep, shard), or the ranks at c's place in every block
// (edp, replica). dp_cp varies dp and cp, dp-major.
std::vector<int> group_members(const Layout& l, Coords c, Axis axis) {
  std::vector<int> out;
  const bool block = axis == Axis::ep || axis == Axis::shard, across = axis == Axis::edp || axis == Axis::replica;
  const int k = axis == Axis::ep || axis == Axis::edp ? l.ep : l.shard();
  const int n = axis == Axis::dp      ? l.dp
                : axis == Axis::tp    ? l.tp
                : axis == Axis::pp    ? l.pp
                : axis == Axis::cp    ? l.cp
                : axis == Axis::dp_cp ? l.dp * l.cp
                : block               ? k
                                      : l.dp / k;
  const int base = c.dp / k * k, place = c.dp % k;
  for (int i = 0; i < n; ++i) {
    if (block)
      c.dp = base + i;
    else if (across)
      c.dp = i * k + place;
    else if (axis == Axis::dp_cp)
      c.dp = i / l.cp, c.cp = i % l.cp;
    else
      (axis == Axis::dp ? c.dp : axis == Axis::tp ? c.tp : axis == Axis::cp ? c.cp : c.pp) = i;
    out.push_back(rank_of(l, c));
  }
  return out;
}

// The axes a mesh builds a communicator for, as group_ranks names them.
struct Named {
  const char* name;
  Axis axis;
};
constexpr Named kGroups[] = {{"dp", Axis::dp},       {"tp", Axis::tp},          {"pp", Axis::pp},
                             {"cp", Axis::cp},       {"dp_cp", Axis::dp_cp},    {"ep", Axis::ep},
                             {"edp", Axis::edp},     {"dp_shard", Axis::shard}, {"dp_replica", Axis::replica}};

}  // namespace

std::vector<int> group_ranks(const Layout& l, const std::string& axis, int rank) {
  const Coords c = coords_of(l, rank);
  for (const Named& g : kGroups)
    if (axis == g.name) return group_members(l, c, g.axis);
  if (axis == "emb") {
    Coords first = c, last = c;
    first.pp = l.emb_first, last.pp = l.last_stage_rank();
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

std::vector<Mesh::Slot> Mesh::slots() {
  return {{&dp_comm_, &dp_},         {&tp_comm_, &tp_},         {&pp_comm_, &pp_},
          {&cp_comm_, &cp_},         {&dp_cp_comm_, &dp_cp_},   {&ep_comm_, &ep_},
          {&edp_comm_, &edp_},       {&shard_comm_, &shard_},   {&replica_comm_, &replica_}};
}

namespace {

// Checked the same on every rank (each sees the same layout), so that every
// rank throws together and none is left waiting in a split.
void check_layout(const Layout& l) {
  if (l.pp < 1 || l.dp < 1 || l.tp < 1 || l.ep < 1 || l.cp < 1)
    core::runtime_error("mesh: layout {} (ep {}) has an axis below 1", describe(l), l.ep);
  if (l.dp % l.ep != 0)
    core::runtime_error("mesh: ep {} does not divide dp {}: expert parallelism splits each data-parallel group", l.ep,
                        l.dp);
  if (l.dp_shard < 0 || l.dp % l.shard() != 0)
    core::runtime_error("mesh: dp_shard {} does not divide dp {}: hybrid sharding splits each data-parallel group",
                        l.dp_shard, l.dp);
}

}  // namespace

Mesh::Mesh(MPI_Comm world, const Layout& l, comm::CommLog& log, comm::Backend backend)
    : layout_(l), backend_(backend) {
  int size = 0;
  STRATA_CHECK_MPI(MPI_Comm_size(world, &size));
  STRATA_CHECK_MPI(MPI_Comm_rank(world, &rank_));
  check_layout(l);
  if (l.world() != size)
    core::runtime_error("mesh: layout {} = {} rank(s), but the world has {}: need pp*dp*cp*tp == world", describe(l),
                        l.world(), size);
  if (!comm::backend_built(backend))
    core::runtime_error("mesh: communicator backend \"{}\" needs the CUDA backend, which this build lacks (configure "
                        "with -DSTRATA_WITH_CUDA=ON, or AUTO where nvcc is found)",
                        comm::describe_backend(backend));
  coords_ = coords_of(l, rank_);
  try {
    STRATA_CHECK_MPI(MPI_Comm_dup(world, &world_comm_));
    STRATA_CHECK_MPI(MPI_Comm_set_errhandler(world_comm_, MPI_ERRORS_RETURN));
    // Each group split by its first member's world rank (the same for every
    // member, different between groups), each rank keyed by its place in
    // the group: the group rank is the position group_ranks gives.
    const std::vector<Slot> slot = slots();
    for (std::size_t i = 0; i < slot.size(); ++i) {
      const std::vector<int> m = group_ranks(l, kGroups[i].name, rank_);
      const int key = int(std::find(m.begin(), m.end(), rank_) - m.begin());
      *slot[i].comm = split(world_comm_, m.front(), key);
    }
    // The first and last pipeline stages of each (dp, cp, tp) position: the
    // two holders of the tied word embedding.
    const std::vector<int> emb = group_ranks(l, "emb", rank_);
    emb_comm_ = split(world_comm_, l.in_emb_group(coords_.pp) ? emb.front() : MPI_UNDEFINED, coords_.pp);
    world_ = profiled(backend, world_comm_, "world", log);
    if (emb_comm_ != MPI_COMM_NULL) emb_ = profiled(backend, emb_comm_, "emb", log);
    for (std::size_t i = 0; i < slot.size(); ++i)
      *slot[i].group = profiled(backend, *slot[i].comm, kGroups[i].name, log);
  } catch (...) {
    // The destructor does not run for a half-built object.
    release();
    throw;
  }
}

Mesh::Mesh(const Layout& l, int rank, comm::CommLog& log) : layout_(l), backend_(comm::Backend::meta), rank_(rank) {
  check_layout(l);
  coords_ = coords_of(l, rank);
  auto meta = [&](const char* axis, int size, int r) -> std::unique_ptr<comm::Communicator> {
    return std::make_unique<comm::ProfiledCommunicator>(std::make_unique<comm::MetaCommunicator>(axis, size, r), log);
  };
  world_ = meta("world", l.world(), rank);
  if (l.in_emb_group(coords_.pp)) emb_ = meta("emb", 2, coords_.pp == l.emb_first ? 0 : 1);
  const std::vector<Slot> slot = slots();
  for (std::size_t i = 0; i < slot.size(); ++i) {
    const std::vector<int> m = group_ranks(l, kGroups[i].name, rank);
    *slot[i].group = meta(kGroups[i].name, int(m.size()), int(std::find(m.begin(), m.end(), rank) - m.begin()));
  }
}

void Mesh::release() {
  world_.reset(), emb_.reset();
  for (const Slot& s : slots()) s.group->reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // the handles died with MPI
  for (const Slot& s : slots()) free_comm(*s.comm);
  free_comm(emb_comm_), free_comm(world_comm_);
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
  if (l.cp > 1) cols.insert(cols.end(), {{"cp group", "cp", Axis::cp}, {"dp_cp group", "dp_cp", Axis::dp_cp}});
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
  const std::size_t wc =
      std::max<std::size_t>(2, fmt::formatted_size("{}", std::max({l.pp, l.dp, l.tp, l.cp}) - 1));
  // The coordinates: pp, dp, (cp,) tp.
  auto line = [&](const std::string& rank, const std::string& host, const std::vector<std::string>& coords,
                  const std::vector<std::string>& groups) {
    std::string s = fmt::format("{:>{}}  {:<{}}", rank, wr, host, wh);
    for (const std::string& x : coords) s += fmt::format("  {:>{}}", x, wc);
    for (std::size_t k = 0; k < groups.size(); ++k)
      s += k + 1 < groups.size() ? fmt::format("  {:<{}}", groups[k], width[k]) : "  " + groups[k];
    return s + "\n";
  };
  std::vector<std::string> headers;
  for (const Column& c : cols) headers.emplace_back(c.header);
  auto coords = [&](const std::string& pp, const std::string& dp, const std::string& cp, const std::string& tp) {
    return l.cp > 1 ? std::vector<std::string>{pp, dp, cp, tp} : std::vector<std::string>{pp, dp, tp};
  };
  std::string out = line("rank", "host", coords("pp", "dp", "cp", "tp"), headers);
  for (int r = 0; r < n; ++r) {
    const Coords c = coords_of(l, r);
    out += line(std::to_string(r), hosts.empty() ? "-" : hosts[std::size_t(r)],
                coords(std::to_string(c.pp), std::to_string(c.dp), std::to_string(c.cp), std::to_string(c.tp)),
                cells[std::size_t(r)]);
  }
  return out;
}

MPI_Comm Mesh::mpi_comm(std::string_view axis) const {
  if (axis == "world") return world_comm_;
  if (axis == "emb") return emb_comm_;
  const std::vector<Slot> slot = const_cast<Mesh*>(this)->slots();
  for (std::size_t i = 0; i < slot.size(); ++i)
    if (axis == kGroups[i].name) return *slot[i].comm;
  return MPI_COMM_NULL;
}

}  // namespace strata::mesh
