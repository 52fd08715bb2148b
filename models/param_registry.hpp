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

// How a rank's tensor relates to the whole along one mesh axis: along
// dimension `split_dim` the local tensor is `sections` blocks, block k being
// part `part` of `parts` of section k of the global tensor (the fused QKV
// weight has three sections, q, k and v, each split by heads over tp; the
// stacked experts [E, ...] one section split by experts over ep). parts == 1:
// the tensor is whole on every rank of that axis.
struct Slice {
  int split_dim = 0;
  int sections = 1;
  int parts = 1;
  int part = 0;
};

struct ParamSpec {
  std::string name;
  std::vector<std::int64_t> shape;         // local
  std::vector<std::int64_t> global_shape;  // of the whole tensor
  Slice tp;                 // over the tensor-parallel ranks
  Slice ep;                 // over the expert-parallel ranks (dimension 0: experts); never with a tp split
  bool expert = false;      // an expert's weight: synchronised over the expert-data-parallel group
  std::int64_t offset = 0;  // elements from the start of the flat buffer
  std::int64_t numel = 0;
  Init init = Init::zeros;
  float init_std = 0.0f;    // for Init::normal
  bool decay = false;       // AdamW weight decay applies (matrices, not biases or norms)
  bool tied_copy = false;   // a second copy of a tied parameter (the last pipeline stage's wte):
                            // its gradient equals the first copy's once summed, and counts once

  bool replicated() const { return tp.parts == 1; }
  // Index in the whole tensor of local element `local` (row-major).
  std::int64_t global_index(std::int64_t local) const;
};

class ParamRegistry {
 public:
  // Appends a parameter after the previous one and returns its index.
  // `global_shape` is the whole tensor; with a split `tp`, this rank holds
  // global_shape[split_dim] / parts of it along split_dim.
  int add(std::string name, std::vector<std::int64_t> global_shape, Init init, float init_std, bool decay,
          Slice tp = {});
  // Marks parameter i as an expert weight, this rank holding `ep` of it
  // (global_shape[0] experts, local shape[0] = experts / ep.parts).
  void mark_expert(int i, Slice ep);
  const std::vector<ParamSpec>& specs() const { return specs_; }
  void mark_tied_copy(int i) { specs_[i].tied_copy = true; }
  // Appends every parameter of `other` after the last one (offsets shifted):
  // the layout of a rank that holds several model chunks.
  void append(const ParamRegistry& other);
  // Appends the parameters of `other` in its flat range [begin, end) (whole
  // parameters, covering it) after the last one: a sub-layout.
  void append_range(const ParamRegistry& other, std::int64_t begin, std::int64_t end);
  const ParamSpec& at(int i) const { return specs_[i]; }
  const ParamSpec& find(const std::string& name) const;  // runtime error if absent
  const ParamSpec* lookup(const std::string& name) const;  // null if absent
  std::int64_t numel() const { return numel_; }

 private:
  std::vector<ParamSpec> specs_;
  std::int64_t numel_ = 0;
};

}  // namespace strata::models
