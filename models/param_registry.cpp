#include "models/param_registry.hpp"

#include "src/core/error.hpp"

namespace strata::models {

int ParamRegistry::add(std::string name, std::vector<std::int64_t> shape, Init init, float init_std, bool decay) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  ParamSpec s{std::move(name), std::move(shape), numel_, n, init, init_std, decay};
  numel_ += n;
  specs_.push_back(std::move(s));
  return static_cast<int>(specs_.size()) - 1;
}

const ParamSpec& ParamRegistry::find(const std::string& name) const {
  for (const auto& s : specs_)
    if (s.name == name) return s;
  core::runtime_error("no parameter named '{}'", name);
}

}  // namespace strata::models
