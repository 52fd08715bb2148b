#include "strategies/registry.hpp"

#include <algorithm>

#include <fmt/args.h>
#include <fmt/format.h>

#include "kernels/foundation/error.hpp"
#include "strategies/dp.hpp"
#include "models/model.hpp"
#include "plan/plan.hpp"
#include "strategies/zero.hpp"

namespace strata::strategies {

const std::vector<StateRow>& state_rows() {
  static const std::vector<StateRow> rows = {data_parallel_row(), zero_row()};
  return rows;
}

const StateRow& chosen_state(const plan::Plan& p) {
  const StateRow* found = nullptr;
  for (const StateRow& r : state_rows())
    if (r.chosen(p)) {
      STRATA_CHECK(found == nullptr, "the plan chooses two state strategies, {} and {}", found->name, r.name);
      found = &r;
    }
  STRATA_CHECK(found != nullptr, "the plan chooses no state strategy");
  return *found;
}

const std::vector<const Row*>& all_rows() {
  static const std::vector<const Row*> rows = [] {
    std::vector<const Row*> out;
    for (const StateRow& r : state_rows()) out.push_back(&r);
    for (const Row& r : layer_rows()) out.push_back(&r);
    out.push_back(&pipeline_row());
    out.push_back(&offload_row());
    return out;
  }();
  return rows;
}

mesh::Layout layout_of(const plan::Plan& p, const std::vector<const Row*>& rows) {
  mesh::Layout l;
  for (const Row* r : rows)
    if (r->axes != nullptr) r->axes(p, l);
  return l;
}

mesh::Layout layout_of(const plan::Plan& p) { return layout_of(p, all_rows()); }

Parallel parallelize(const plan::Plan& p, const MeshGroups* mesh) {
  const NoGroups none;
  Parallel out;
  for (const Row* r : all_rows())
    if (r->compose != nullptr) r->compose(p, mesh != nullptr ? *mesh : none, out);
  return out;
}

void check_plan(const plan::Plan& p, PlanChecks& checks) {
  // The mesh's size in 64 bits: its dims may multiply past an int.
  const mesh::Layout layout = layout_of(p);
  std::int64_t world = 1;
  for (const mesh::Dim& d : layout.dims) world = std::min<std::int64_t>(world * d.size, kMaxWorld + 1);
  if (world > kMaxWorld) {
    checks.error({"parallel.dp", "parallel.tp", "parallel.pp", "parallel.cp"},
                 fmt::format("the layout has more than {} ranks ({}): at most {} (2^20) are supported", kMaxWorld,
                             mesh::describe(layout), kMaxWorld));
    return;
  }
  for (const Row* r : all_rows())
    if (r->check != nullptr) r->check(p, checks);
  for (const Conflict& c : conflicts()) {
    if (!c.when(p)) continue;
    fmt::dynamic_format_arg_store<fmt::format_context> shown;
    for (std::string_view k : c.keys) shown.push_back(checks.show(k));
    checks.error(c.keys, fmt::vformat(c.message, shown));
  }
}

int devices_left(const Space& s, const plan::Plan& p) {
  const int used = layout_of(p).world();
  return s.world % used == 0 ? s.world / used : 0;
}

std::vector<int> divisors(int n) {
  std::vector<int> low, high;
  for (int d = 1; d <= n / d; ++d)
    if (n % d == 0) {
      low.push_back(d);
      if (d != n / d) high.push_back(n / d);
    }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

std::vector<const Search*> searches() {
  std::vector<const Search*> out;
  for (const Row* r : all_rows())
    for (const Search& s : r->search) out.push_back(&s);
  std::stable_sort(out.begin(), out.end(), [](const Search* a, const Search* b) { return a->order < b->order; });
  return out;
}

}  // namespace strata::strategies

namespace strata::plan {

const std::vector<KeySpec>& key_table() {
  // The sections in the order of docs/decks.md and of a resolved deck; a
  // row's keys go to the end of their section, in row order.
  static const std::vector<KeySpec> table = [] {
    static constexpr std::string_view kOrder[] = {"run", "model", "data", "parallel", "optim", "backend", "offload"};
    // model.kind first, then the keys of the whole run, the model families'
    // and every row's.
    const std::vector<KeySpec> models = models::model_keys();
    std::vector<KeySpec> all = {models.front()};
    for (const KeySpec& k : global_keys()) all.push_back(k);
    all.insert(all.end(), models.begin() + 1, models.end());
    for (const strategies::Row* r : strategies::all_rows()) all.insert(all.end(), r->keys.begin(), r->keys.end());
    auto rank = [](const KeySpec& k) { return std::find(std::begin(kOrder), std::end(kOrder), k.section) - kOrder; };
    std::stable_sort(all.begin(), all.end(), [&](const KeySpec& a, const KeySpec& b) { return rank(a) < rank(b); });
    return all;
  }();
  return table;
}

std::vector<std::string_view> section_names() {
  std::vector<std::string_view> out;
  for (const KeySpec& k : key_table())
    if (std::find(out.begin(), out.end(), k.section) == out.end()) out.push_back(k.section);
  return out;
}

const KeySpec* find_key(std::string_view section, std::string_view name) {
  for (const KeySpec& k : key_table())
    if (k.section == section && k.name == name) return &k;
  return nullptr;
}

std::vector<std::string_view> Choice<Schedule>::names() {
  std::vector<std::string_view> out;
  for (const auto& s : strategies::pp::schedules()) out.push_back(s.name);
  return out;
}

Schedule Choice<Schedule>::at(std::size_t i) { return &strategies::pp::schedules()[i]; }

std::size_t Choice<Schedule>::index(Schedule s) { return std::size_t(s - strategies::pp::schedules().data()); }

}  // namespace strata::plan
