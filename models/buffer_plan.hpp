// One buffer a model or layer allocates per micro-batch shape: its name,
// element count and category. The same list drives allocation and the
// dry-run estimate, so the two cannot disagree.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/foundation/memory.hpp"

namespace strata::models {

struct BufferPlan {
  std::string name;
  std::int64_t numel;
  core::MemCategory category;
};

}  // namespace strata::models
