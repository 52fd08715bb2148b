// Training data, keyed by global sample index: sample i of the run is a pure
// function of (seed, i), so every parallel layout that splits a global batch
// differently still sees the same sequences. Two sources: synthetic token ids
// and byte-level text from a file (vocabulary 256).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "plan/plan.hpp"

namespace strata::train {

class DataSource {
 public:
  virtual ~DataSource() = default;
  // The T + 1 token ids of global sample `index` (inputs are [0, T), targets [1, T]).
  virtual void sample(std::int64_t index, int T, std::int32_t* out) const = 0;
  virtual std::string describe() const = 0;
};

std::unique_ptr<DataSource> make_data_source(const plan::Plan& config);

// Fills tokens and targets [B, T] with samples first_sample .. first_sample + B - 1.
void fill_batch(const DataSource& data, std::int64_t first_sample, int B, int T, std::int32_t* tokens,
                std::int32_t* targets);

}  // namespace strata::train
