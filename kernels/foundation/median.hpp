// The median of a sample (0 for none): what every timing summary reports,
// as the middle of noisy measurements rather than their mean.
#pragma once

#include <algorithm>
#include <vector>

namespace strata::core {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace strata::core
