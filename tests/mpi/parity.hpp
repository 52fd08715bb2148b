// Helpers shared by the MPI parity tests: how far a rank's parameters are
// from the single-rank run's (and the world size).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "models/param_registry.hpp"
#include "tests/mpi/mpi_world.hpp"

namespace strata::parity {

using mpi_test::world_size;

// Largest norm-wise relative difference ||a - b|| / ||b|| over the parameter
// tensors between this rank's parameters (`mine`, laid out by `local`, which
// may be a tensor-parallel shard) and their slice of the single-rank ones
// (`ref`, laid out by `whole`). Norm-wise, because Adam divides each gradient
// element by its own running scale: an element whose gradient is a
// near-cancelling sum moves by ~lr in a direction set by rounding, and a
// tensor norm weighs that by its size.
//
// The key slice of each attention bias is held to an absolute bound instead
// (returned in `key_abs`): its gradient is exactly zero (q.b_k shifts a whole
// row of scores, which softmax ignores), it has no effect on the output, and
// its rounding noise, summed in a different order on each layout, is
// amplified by Adam into updates of varying sign.
// `worst`, when given, names the tensor with the largest difference.
inline double params_error(const models::ParamRegistry& local, const std::vector<float>& mine,
                           const models::ParamRegistry& whole, const std::vector<float>& ref, double* key_abs,
                           std::string* worst_name = nullptr) {
  double worst = 0;
  *key_abs = 0;
  for (const auto& s : local.specs()) {
    const auto& w = whole.find(s.name);
    const bool qkv_bias = s.name.ends_with("attn.qkv.bias");
    const std::int64_t C = w.global_shape[0] / 3;
    double diff = 0, norm = 0;
    for (std::int64_t k = 0; k < s.numel; ++k) {
      const std::int64_t g = s.global_index(k);
      const double want = ref[w.offset + g], d = double(mine[s.offset + k]) - want;
      if (qkv_bias && g >= C && g < 2 * C) {
        *key_abs = std::max(*key_abs, std::fabs(d));
      } else {
        diff += d * d;
        norm += want * want;
      }
    }
    const double e = std::sqrt(diff / std::max(norm, 1e-30));
    if (e > worst && worst_name != nullptr) *worst_name = s.name;
    worst = std::max(worst, e);
  }
  return worst;
}

}  // namespace strata::parity
