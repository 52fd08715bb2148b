#include "models/model.hpp"

#include <algorithm>

#include "kernels/foundation/error.hpp"

namespace strata::models {

std::vector<int> stage_block_counts(int layers, int stages, int first, int last) {
  STRATA_CHECK(stages >= 1, "{} pipeline stages", stages);
  if (stages == 1) return {layers};
  const int fixed = (first >= 0) + (last >= 0), rest = layers - std::max(first, 0) - std::max(last, 0);
  const int others = stages - fixed;
  STRATA_CHECK(rest >= 0 && (others == 0 ? rest == 0 : rest % others == 0 && rest / others >= 1),
               "{} layers over {} stages (first {}, last {}): the other stages do not get the same number, at least 1",
               layers, stages, first, last);
  std::vector<int> n(std::size_t(stages), others > 0 ? rest / others : 0);
  if (first >= 0) n.front() = first;
  if (last >= 0) n.back() = last;
  return n;
}

Stage stage_of(int layers, int index, int count, int first, int last) {
  const std::vector<int> n = stage_block_counts(layers, count, first, last);
  int begin = 0;
  for (int s = 0; s < index; ++s) begin += n[std::size_t(s)];
  return Stage{begin, begin + n[std::size_t(index)], index == 0, index == count - 1};
}

const Family& family(const plan::Plan& p) { return *p.model.kind; }

std::int64_t parameter_count(const plan::Plan& p) { return std::int64_t(family(p).parameters(p)); }

std::vector<plan::KeySpec> model_keys() {
  using plan::key, plan::Plan, plan::ModelSection;
  std::vector<plan::KeySpec> out = {
      key<&Plan::model, &ModelSection::kind>("model", "kind", "model family: a row of models/families.cpp")};
  for (const Family& f : families())
    for (const plan::KeySpec& k : f.keys)
      if (std::none_of(out.begin(), out.end(), [&](const plan::KeySpec& o) { return o.name == k.name; }))
        out.push_back(k);
  return out;
}

bool takes_key(const Family& f, std::string_view name) {
  return std::any_of(f.keys.begin(), f.keys.end(), [&](const plan::KeySpec& k) { return k.name == name; });
}

std::vector<std::string_view> families_taking(std::string_view name) {
  std::vector<std::string_view> out;
  for (const Family& f : families())
    if (takes_key(f, name)) out.push_back(f.name);
  return out;
}

const Family& find_family(std::string_view name) {
  for (const Family& f : families())
    if (f.name == name) return f;
  core::runtime_error("no model family '{}'", name);
}

}  // namespace strata::models

namespace strata::plan {

std::vector<std::string_view> Choice<ModelKind>::names() {
  std::vector<std::string_view> out;
  for (const auto& f : models::families()) out.push_back(f.name);
  return out;
}

ModelKind Choice<ModelKind>::at(std::size_t i) { return &models::families()[i]; }

std::size_t Choice<ModelKind>::index(ModelKind k) { return std::size_t(k - models::families().data()); }

}  // namespace strata::plan
