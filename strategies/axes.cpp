#include "strategies/axes.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "kernels/foundation/error.hpp"

namespace strata::mesh {

int Layout::world() const {
  int n = 1;
  for (const Dim& d : dims) n *= d.size;
  return n;
}

int Layout::dim_index(std::string_view dim) const {
  for (std::size_t i = 0; i < dims.size(); ++i)
    if (dims[i].name == dim) return int(i);
  return -1;
}

int Layout::size(std::string_view dim) const {
  const int i = dim_index(dim);
  return i < 0 ? 1 : dims[std::size_t(i)].size;
}

const Group* Layout::group(std::string_view name) const {
  for (const Group& g : groups)
    if (g.name == name) return &g;
  return nullptr;
}

namespace {

// Members of group `g` through coordinates `c`, as coordinates vary.
template <typename F>
void for_each_member(const Layout& l, const Group& g, std::vector<int> c, F f) {
  if (g.cut != Group::Cut::none || !g.only.empty()) {
    const int d = l.dim_index(g.dims.front());
    const int n = l.dims[std::size_t(d)].size, k = g.block, at = c[std::size_t(d)];
    std::vector<int> along;
    if (g.cut == Group::Cut::within)
      for (int i = 0; i < k; ++i) along.push_back(at / k * k + i);
    else if (g.cut == Group::Cut::across)
      for (int i = 0; i < n / k; ++i) along.push_back(i * k + at % k);
    else if (std::find(g.only.begin(), g.only.end(), at) != g.only.end())
      along = g.only;
    for (int x : along) {
      c[std::size_t(d)] = x;
      f(c);
    }
    return;
  }
  // Every combination of the varied dims, the last fastest.
  std::vector<int> idx;
  for (const std::string& name : g.dims) idx.push_back(l.dim_index(name));
  std::vector<int> at(idx.size(), 0);
  for (std::size_t i = 0; i < idx.size(); ++i) c[std::size_t(idx[i])] = 0;
  for (;;) {
    f(c);
    std::size_t k = idx.size();
    while (k > 0) {
      --k;
      int& x = c[std::size_t(idx[k])];
      if (++x < l.dims[std::size_t(idx[k])].size) break;
      x = 0;
      if (k == 0) return;
    }
    if (idx.empty()) return;
  }
}

}  // namespace

int Layout::group_size(std::string_view name) const {
  if (name == "world") return world();
  const Group* g = group(name);
  STRATA_CHECK(g != nullptr, "the layout has no group '{}'", name);
  if (g->cut == Group::Cut::within) return g->block;
  if (g->cut == Group::Cut::across) return size(g->dims.front()) / g->block;
  if (!g->only.empty()) return int(g->only.size());
  int n = 1;
  for (const std::string& d : g->dims) n *= size(d);
  return n;
}

std::vector<std::string> Layout::axis_names() const {
  std::vector<std::string> out = {"world"};
  for (const Group& g : groups) out.push_back(g.name);
  return out;
}

void add_dim(Layout& l, Dim d) {
  const auto at = std::find_if(l.dims.begin(), l.dims.end(), [&](const Dim& x) { return x.nest > d.nest; });
  l.dims.insert(at, std::move(d));
}

void add_group(Layout& l, Group g) {
  std::sort(g.only.begin(), g.only.end());
  g.only.erase(std::unique(g.only.begin(), g.only.end()), g.only.end());
  l.groups.push_back(std::move(g));
}

void check_layout(const Layout& l) {
  std::set<std::string> names = {"world"};
  for (const Dim& d : l.dims) {
    if (d.size < 1) core::runtime_error("mesh: layout {} has {} = {}: every axis needs at least 1 rank", describe(l), d.name, d.size);
    if (!names.insert(d.name).second) core::runtime_error("mesh: two dims are named '{}'", d.name);
  }
  names = {"world"};
  for (const Group& g : l.groups) {
    if (!names.insert(g.name).second) core::runtime_error("mesh: two groups are named '{}'", g.name);
    for (const std::string& d : g.dims)
      if (l.dim_index(d) < 0) core::runtime_error("mesh: group '{}' varies '{}', which is not a dim of the layout", g.name, d);
    const bool one_dim = g.cut != Group::Cut::none || !g.only.empty();
    if (one_dim && g.dims.size() != 1) core::runtime_error("mesh: group '{}' cuts or picks from one dim, not {}", g.name, g.dims.size());
    if (g.cut != Group::Cut::none && (g.block < 1 || l.size(g.dims.front()) % g.block != 0))
      core::runtime_error("mesh: group {} cuts {} {} into blocks of {}: a block must divide the {} ranks", g.name,
                          g.dims.front(), l.size(g.dims.front()), g.block, g.dims.front());
    for (int x : g.only)
      if (x < 0 || x >= l.size(g.dims.front()))
        core::runtime_error("mesh: group '{}' takes {} coordinate {}, outside 0..{}", g.name, g.dims.front(), x,
                            l.size(g.dims.front()) - 1);
  }
}

std::vector<int> coords_of(const Layout& l, int rank) {
  STRATA_CHECK(rank >= 0 && rank < l.world(), "rank {} outside a world of {}", rank, l.world());
  std::vector<int> c(l.dims.size(), 0);
  for (std::size_t i = l.dims.size(); i-- > 0;) {
    c[i] = rank % l.dims[i].size;
    rank /= l.dims[i].size;
  }
  return c;
}

int rank_of(const Layout& l, const std::vector<int>& c) {
  STRATA_CHECK(c.size() == l.dims.size(), "{} coordinates for a layout of {} dims", c.size(), l.dims.size());
  int r = 0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    STRATA_CHECK(c[i] >= 0 && c[i] < l.dims[i].size, "coordinate {} = {} outside layout {}", l.dims[i].name, c[i],
                 describe(l));
    r = r * l.dims[i].size + c[i];
  }
  return r;
}

int coord(const Layout& l, int rank, std::string_view dim) {
  const int i = l.dim_index(dim);
  if (i < 0) return 0;
  int stride = 1;  // of dim i: the product of the faster dims' sizes
  for (std::size_t j = std::size_t(i) + 1; j < l.dims.size(); ++j) stride *= l.dims[j].size;
  return rank / stride % l.dims[std::size_t(i)].size;
}

int rank_at(const Layout& l, const std::vector<std::pair<std::string_view, int>>& at) {
  std::vector<int> c(l.dims.size(), 0);
  for (const auto& [dim, x] : at) {
    const int i = l.dim_index(dim);
    STRATA_CHECK(i >= 0 || x == 0, "the layout has no dim '{}'", dim);
    if (i >= 0) c[std::size_t(i)] = x;
  }
  return rank_of(l, c);
}

std::vector<int> group_ranks(const Layout& l, std::string_view name, int rank) {
  std::vector<int> out;
  if (name == "world") {
    for (int r = 0; r < l.world(); ++r) out.push_back(r);
    return out;
  }
  const Group* g = l.group(name);
  STRATA_CHECK(g != nullptr, "the layout has no group '{}'", name);
  for_each_member(l, *g, coords_of(l, rank), [&](const std::vector<int>& c) { out.push_back(rank_of(l, c)); });
  return out;
}

bool first_copy(const Layout& l, int rank) {
  for (const Group& g : l.groups)
    if (g.same_params) {
      const std::vector<int> m = group_ranks(l, g.name, rank);
      if (!m.empty() && m.front() != rank) return false;
    }
  return true;
}

std::string describe(const Layout& l) {
  std::string s;
  for (const Dim& d : l.dims)
    if (d.shown) s += fmt::format("{}{} {}", s.empty() ? "" : " x ", d.name, d.size);
  for (const Group& g : l.groups)
    if (g.shown && g.cut == Group::Cut::within) s += fmt::format(" ({} {})", g.name, g.block);
  return s;
}

namespace {

// "dp{0,2}"; a group is an arithmetic progression of ranks, so long ones are
// shortened to "dp{0,2,..,30}" and a table for thousands of ranks stays readable.
std::string group_text(const std::string& name, const std::vector<int>& m) {
  std::string s = fmt::format("{}{{", name);
  if (m.size() <= 4) {
    for (std::size_t i = 0; i < m.size(); ++i) s += fmt::format("{}{}", i ? "," : "", m[i]);
  } else {
    s += fmt::format("{},{},..,{}", m[0], m[1], m.back());
  }
  return s + "}";
}

}  // namespace

std::string layout_table(const Layout& l, const std::vector<std::string>& hosts) {
  const int n = l.world();
  std::vector<std::size_t> dims;
  int widest = 1;
  for (std::size_t i = 0; i < l.dims.size(); ++i)
    if (l.dims[i].shown) dims.push_back(i), widest = std::max(widest, l.dims[i].size);
  std::vector<const Group*> cols;
  for (const Group& g : l.groups)
    if (g.shown) cols.push_back(&g);
  std::vector<std::vector<std::string>> cells(static_cast<std::size_t>(n));
  std::vector<std::size_t> width;
  for (const Group* g : cols) width.push_back(g->name.size() + 6);
  std::size_t wh = 4;
  for (int r = 0; r < n; ++r) {
    for (std::size_t k = 0; k < cols.size(); ++k) {
      cells[std::size_t(r)].push_back(group_text(cols[k]->name, group_ranks(l, cols[k]->name, r)));
      width[k] = std::max(width[k], cells[std::size_t(r)].back().size());
    }
    if (!hosts.empty()) wh = std::max(wh, hosts[std::size_t(r)].size());
  }
  const std::size_t wr = std::max<std::size_t>(4, fmt::formatted_size("{}", n - 1));
  std::size_t wc = fmt::formatted_size("{}", widest - 1);
  for (std::size_t i : dims) wc = std::max(wc, l.dims[i].name.size());
  auto line = [&](const std::string& rank, const std::string& host, const std::vector<std::string>& coords,
                  const std::vector<std::string>& groups) {
    std::string s = fmt::format("{:>{}}  {:<{}}", rank, wr, host, wh);
    for (const std::string& x : coords) s += fmt::format("  {:>{}}", x, wc);
    for (std::size_t k = 0; k < groups.size(); ++k)
      s += k + 1 < groups.size() ? fmt::format("  {:<{}}", groups[k], width[k]) : "  " + groups[k];
    return s + "\n";
  };
  std::vector<std::string> heads, headers;
  for (std::size_t i : dims) heads.push_back(l.dims[i].name);
  for (const Group* g : cols) headers.push_back(g->name + " group");
  std::string out = line("rank", "host", heads, headers);
  for (int r = 0; r < n; ++r) {
    const std::vector<int> c = coords_of(l, r);
    std::vector<std::string> at;
    for (std::size_t i : dims) at.push_back(std::to_string(c[i]));
    out += line(std::to_string(r), hosts.empty() ? "-" : hosts[std::size_t(r)], at, cells[std::size_t(r)]);
  }
  return out;
}

}  // namespace strata::mesh
