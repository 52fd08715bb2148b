#include "strategies/registry.hpp"

#include <algorithm>

#include "kernels/foundation/error.hpp"
#include "strategies/dp.hpp"
#include "strategies/plan.hpp"
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

namespace {

// Every row, in the order their keys are listed within a section.
std::vector<const Row*> all_rows() {
  std::vector<const Row*> rows;
  for (const StateRow& r : state_rows()) rows.push_back(&r);
  for (const Row& r : layer_rows()) rows.push_back(&r);
  rows.push_back(&pipeline_row());
  rows.push_back(&offload_row());
  return rows;
}

}  // namespace

void check_plan(const plan::Plan& p, PlanChecks& checks) {
  for (const Row* r : all_rows())
    if (r->check != nullptr) r->check(p, checks);
}

}  // namespace strata::strategies

namespace strata::plan {

const std::vector<KeySpec>& key_table() {
  // The sections in the order of docs/decks.md and of a resolved deck; a
  // row's keys go to the end of their section, in row order.
  static const std::vector<KeySpec> table = [] {
    static constexpr std::string_view kOrder[] = {"run", "model", "data", "parallel", "optim", "backend", "offload"};
    std::vector<KeySpec> all = global_keys();
    for (const strategies::Row* r : strategies::all_rows()) all.insert(all.end(), r->keys.begin(), r->keys.end());
    auto rank = [](const KeySpec& k) { return std::find(std::begin(kOrder), std::end(kOrder), k.section) - kOrder; };
    std::stable_sort(all.begin(), all.end(), [&](const KeySpec& a, const KeySpec& b) { return rank(a) < rank(b); });
    return all;
  }();
  return table;
}

std::vector<std::string_view> Choice<Schedule>::names() {
  std::vector<std::string_view> out;
  for (const auto& s : strategies::pp::schedules()) out.push_back(s.name);
  return out;
}

Schedule Choice<Schedule>::at(std::size_t i) { return &strategies::pp::schedules()[i]; }

std::size_t Choice<Schedule>::index(Schedule s) { return std::size_t(s - strategies::pp::schedules().data()); }

}  // namespace strata::plan
