// The model families: one row each, in the order model.kind lists them.
// Adding a family is its folder (its model and its row) and a line here.
#include "models/gpt/family.hpp"
#include "models/llama/family.hpp"
#include "models/model.hpp"

namespace strata::models {

const std::vector<Family>& families() {
  static const std::vector<Family> all = {gpt_family(), moe_family(), llama_family()};
  return all;
}

}  // namespace strata::models
