// The layer seams a model is built with, as one bundle: where its layers
// meet the ranks they are split over (tensor_seam.hpp), the ranks holding
// the other experts (expert_seam.hpp) and those holding the rest of each
// sequence (context_seam.hpp). Each defaults to its plain one-rank form;
// strategies::parallelize builds the parallel ones. They must outlive the
// models built with them.
#pragma once

#include "models/context_seam.hpp"
#include "models/expert_seam.hpp"
#include "models/tensor_seam.hpp"

namespace strata::models {

struct Seams {
  TensorSeam* tp = &one_rank();
  ExpertSeam* ep = &one_expert_rank();
  ContextSeam* cp = &whole_sequence();
};

}  // namespace strata::models
