#include "models/param_registry.hpp"

#include "kernels/foundation/error.hpp"

namespace strata::models {

std::int64_t ParamSpec::global_index(std::int64_t local) const {
  const Slice& sl = tp.parts > 1 ? tp : ep;
  if (sl.parts == 1) return local;
  // The flattened trailing dimensions are one column dimension: [n, rest]
  // (a 1-D tensor is [n, 1]); only dimension 0 or 1 is ever split.
  std::int64_t cols = 1, gcols = 1;
  for (std::size_t d = 1; d < shape.size(); ++d) cols *= shape[d], gcols *= global_shape[d];
  const std::int64_t rows = shape[0], grows = global_shape[0];
  std::int64_t i = local / cols, j = local % cols;
  if (sl.split_dim == 0) {
    const std::int64_t lsec = rows / sl.sections, gsec = grows / sl.sections;
    i = (i / lsec) * gsec + sl.part * lsec + i % lsec;
  } else {
    const std::int64_t lsec = cols / sl.sections, gsec = gcols / sl.sections;
    j = (j / lsec) * gsec + sl.part * lsec + j % lsec;
  }
  return i * gcols + j;
}

int ParamRegistry::add(std::string name, std::vector<std::int64_t> global_shape, Init init, float init_std, bool decay,
                       Slice tp) {
  std::vector<std::int64_t> shape = global_shape;
  if (tp.parts > 1) {
    STRATA_CHECK(shape[tp.split_dim] % (std::int64_t(tp.parts) * tp.sections) == 0,
                 "{}: dimension {} of {} does not split into {} x {}", name, tp.split_dim, shape[tp.split_dim],
                 tp.sections, tp.parts);
    shape[tp.split_dim] /= tp.parts;
  }
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  ParamSpec s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.global_shape = std::move(global_shape);
  s.tp = tp;
  s.offset = numel_;
  s.numel = n;
  s.init = init;
  s.init_std = init_std;
  s.decay = decay;
  numel_ += n;
  specs_.push_back(std::move(s));
  return static_cast<int>(specs_.size()) - 1;
}

void ParamRegistry::mark_expert(int i, Slice ep) {
  ParamSpec& s = specs_[std::size_t(i)];
  s.expert = true;
  if (ep.parts == 1) return;
  STRATA_CHECK(s.tp.parts == 1 && ep.split_dim == 0 && ep.sections == 1, "{}: experts split over ep only, by dimension 0",
               s.name);
  STRATA_CHECK(s.shape[0] % ep.parts == 0, "{}: {} experts do not split over ep {}", s.name, s.shape[0], ep.parts);
  const std::int64_t n = s.numel / ep.parts;
  STRATA_CHECK(s.offset + s.numel == numel_, "{}: mark an expert weight right after adding it", s.name);
  s.shape[0] /= ep.parts;
  s.ep = ep;
  numel_ -= s.numel - n;
  s.numel = n;
}

void ParamRegistry::append(const ParamRegistry& other) {
  for (ParamSpec s : other.specs_) {
    s.offset += numel_;
    specs_.push_back(std::move(s));
  }
  numel_ += other.numel_;
}

void ParamRegistry::append_range(const ParamRegistry& other, std::int64_t begin, std::int64_t end) {
  for (ParamSpec s : other.specs_) {
    if (s.offset < begin || s.offset >= end) continue;
    STRATA_CHECK(s.offset + s.numel <= end, "{} straddles the end of flat range [{}, {})", s.name, begin, end);
    s.offset = s.offset - begin + numel_;
    specs_.push_back(std::move(s));
  }
  numel_ += end - begin;
}

const ParamSpec* ParamRegistry::lookup(const std::string& name) const {
  for (const auto& s : specs_)
    if (s.name == name) return &s;
  return nullptr;
}

const ParamSpec& ParamRegistry::find(const std::string& name) const {
  if (const ParamSpec* s = lookup(name)) return *s;
  core::runtime_error("no parameter named '{}'", name);
}

}  // namespace strata::models
