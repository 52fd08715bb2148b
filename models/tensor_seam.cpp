#include "models/tensor_seam.hpp"

namespace strata::models {

TensorSeam& one_rank() {
  static OneRank seam;
  return seam;
}

}  // namespace strata::models
