#include "models/param_registry.hpp"

#include "src/core/error.hpp"

namespace strata::models {

std::int64_t ParamSpec::global_index(std::int64_t local) const {
  if (tp.parts == 1) return local;
  // A 1-D tensor is a column: [n, 1].
  const std::int64_t rows = shape[0], cols = shape.size() > 1 ? shape[1] : 1;
  const std::int64_t grows = global_shape[0], gcols = global_shape.size() > 1 ? global_shape[1] : 1;
  std::int64_t i = local / cols, j = local % cols;
  if (tp.split_dim == 0) {
    const std::int64_t lsec = rows / tp.sections, gsec = grows / tp.sections;
    i = (i / lsec) * gsec + tp.part * lsec + i % lsec;
  } else {
    const std::int64_t lsec = cols / tp.sections, gsec = gcols / tp.sections;
    j = (j / lsec) * gsec + tp.part * lsec + j % lsec;
  }
  return i * gcols + j;
}

int ParamRegistry::add(std::string name, std::vector<std::int64_t> global_shape, Init init, float init_std, bool decay,
                       TpSlice tp) {
  std::vector<std::int64_t> shape = global_shape;
  if (tp.parts > 1) {
    STRATA_CHECK(shape[tp.split_dim] % (std::int64_t(tp.parts) * tp.sections) == 0,
                 "{}: dimension {} of {} does not split into {} x {}", name, tp.split_dim, shape[tp.split_dim],
                 tp.sections, tp.parts);
    shape[tp.split_dim] /= tp.parts;
  }
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  ParamSpec s{std::move(name), std::move(shape), std::move(global_shape), tp, numel_, n, init, init_std, decay};
  numel_ += n;
  specs_.push_back(std::move(s));
  return static_cast<int>(specs_.size()) - 1;
}

void ParamRegistry::append(const ParamRegistry& other) {
  for (ParamSpec s : other.specs_) {
    s.offset += numel_;
    specs_.push_back(std::move(s));
  }
  numel_ += other.numel_;
}

const ParamSpec& ParamRegistry::find(const std::string& name) const {
  for (const auto& s : specs_)
    if (s.name == name) return s;
  core::runtime_error("no parameter named '{}'", name);
}

}  // namespace strata::models
