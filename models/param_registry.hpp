// The parameter registry: every parameter of a model is a named view into one
// flat contiguous buffer (and its gradient into a second buffer of the same
// layout). Flat buffers are what bucketed all-reduce and ZeRO slice; names are
// what initialisation, weight decay, exports and parity tests key on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::models {

enum class Init { normal, zeros, ones };

struct ParamSpec {
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t offset = 0;  // elements from the start of the flat buffer
  std::int64_t numel = 0;
  Init init = Init::zeros;
  float init_std = 0.0f;    // for Init::normal
  bool decay = false;       // AdamW weight decay applies (matrices, not biases or norms)
};

class ParamRegistry {
 public:
  // Appends a parameter after the previous one and returns its index.
  int add(std::string name, std::vector<std::int64_t> shape, Init init, float init_std, bool decay);
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const ParamSpec& at(int i) const { return specs_[i]; }
  const ParamSpec& find(const std::string& name) const;  // runtime error if absent
  std::int64_t numel() const { return numel_; }

 private:
  std::vector<ParamSpec> specs_;
  std::int64_t numel_ = 0;
};

}  // namespace strata::models
