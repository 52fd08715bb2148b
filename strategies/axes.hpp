// The process mesh's named axes, as the registry's rows declare them
// (strategies/registry.hpp, Row::axes). A layout is an ordered list of dims,
// the coordinates of a rank (the first varies slowest), and the groups the
// strategies communicate over, each a rule that picks a rank's fellow
// members from its coordinates. Everything that lists axes (the mesh's
// communicators, the comm log's axes, the report's /ranks columns and
// per-axis figures, a checkpoint's layout, the dry run's mesh table, the
// simulator's stages and node placement, the traces) reads them here, so a
// new axis is a row that declares it. Arithmetic only: src/mesh builds the
// communicators.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata::mesh {

// A coordinate of the mesh: `size` ranks along it.
struct Dim {
  std::string name = {};
  int size = 1;
  // Where it nests: dims are ordered by it, the smallest varying slowest
  // (pp 100, dp 200, cp 300, tp 400: tp fastest, so it stays inside a node).
  int nest = 0;
  std::string doc = {};  // what the coordinate is: the /ranks column's description
  bool shown = true;  // in the layout's description and table (its row decides: cp only when > 1)
};

// A group of ranks: those whose coordinates equal the rank's own on every
// dim but `dims`, which vary (major first). A group of one dim may instead
// cut it into blocks of `block` consecutive coordinates and take the block
// through the rank (within: expert parallelism's ep, hybrid sharding's
// shard group) or the ranks at the rank's place in every block (across:
// edp, the replica group); or take only some of its coordinates (`only`:
// the first and last pipeline stage, which both hold the tied embedding),
// where a rank at another coordinate has no such group.
struct Group {
  enum class Cut { none, within, across };
  std::string name = {};
  std::vector<std::string> dims = {};
  Cut cut = Cut::none;
  int block = 1;
  std::vector<int> only = {};
  // Every member holds the same parameters: a checkpoint's layout-free
  // state needs only the first member's (train/checkpoint).
  bool same_params = false;
  bool shown = true;  // in the layout's description and table
  std::string doc = {};
};

struct Layout {
  std::vector<Dim> dims;      // in nesting order
  std::vector<Group> groups;  // in the rows' order; "world", every rank, besides

  int world() const;
  // A dim's size (1 for a dim the layout lacks) and index (-1).
  int size(std::string_view dim) const;
  int dim_index(std::string_view dim) const;
  const Group* group(std::string_view name) const;
  // The size of group `name` (world: world()).
  int group_size(std::string_view name) const;
  // "world", then every group: the axes a rank's communicators are named by.
  std::vector<std::string> axis_names() const;
};

// Adds a dim at its nesting place; adds a group (its dims must be there).
void add_dim(Layout& l, Dim d);
void add_group(Layout& l, Group g);

// A runtime error naming what is wrong: a size below 1, a cut that does not
// divide its dim, a coordinate outside its dim, a name used twice.
void check_layout(const Layout& l);

// A rank's coordinates, one per dim, and back.
std::vector<int> coords_of(const Layout& l, int rank);
int rank_of(const Layout& l, const std::vector<int>& coords);
// Coordinate `dim` of `rank` (0 for a dim the layout lacks).
int coord(const Layout& l, int rank, std::string_view dim);
// The rank at the given coordinates, 0 along every other dim.
int rank_at(const Layout& l, const std::vector<std::pair<std::string_view, int>>& at);

// The world ranks of `rank`'s group `name` ("world": every rank), in
// group-rank order; empty where the rank has no such group. A name the
// layout lacks is an error.
std::vector<int> group_ranks(const Layout& l, std::string_view name, int rank);
// The first members of every same-parameters group through `rank`: whether
// it holds a copy of its parameters no lower rank holds.
bool first_copy(const Layout& l, int rank);

// "pp 2 x dp 4 x tp 1": the shown dims, then the shown groups that cut one
// ("(ep 2)", "(dp_shard 2)").
std::string describe(const Layout& l);

// The mesh table of layout `l`: one line per rank with its host (hosts[r],
// or "-" where hosts is empty), its coordinates along the shown dims and the
// world ranks of each shown group it belongs to.
std::string layout_table(const Layout& l, const std::vector<std::string>& hosts = {});

}  // namespace strata::mesh
