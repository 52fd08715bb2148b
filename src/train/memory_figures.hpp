// One rank's memory over one step, per pool and category: the bytes held at
// its end and the most held at any moment of it, and the most of the whole
// pool at once (what a memory limit is compared with). A run measures these
// from its trackers (rank_memory); a dry run estimates them by running the
// same step on the meta device (src/train/estimate.hpp) and reads them the
// same way, so the two are compared exactly.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/foundation/memory.hpp"
#include "models/nvme.hpp"

namespace strata::train {

struct PoolFigures {
  std::array<std::uint64_t, core::kNumMemCategories> held{}, peak{};
  std::uint64_t total_peak = 0;
  std::uint64_t total_held() const;
  bool operator==(const PoolFigures&) const = default;
};

struct RankMemory {
  std::array<PoolFigures, core::kNumPools> pools;
  const PoolFigures& operator[](core::Pool p) const { return pools[std::size_t(p)]; }
  PoolFigures& operator[](core::Pool p) { return pools[std::size_t(p)]; }
  bool operator==(const RankMemory&) const = default;
};

// "device held params 1.2 MiB (1234567 B) ..., peak ...": every non-zero
// figure, for messages.
std::string describe(const RankMemory& m);

// From the trackers (peaks since their last reset_peaks) and the NVMe file
// (null without), whose regions are held for the whole run.
RankMemory rank_memory(const core::MemoryTracker& device, const core::MemoryTracker& host,
                       const models::NvmeFile* nvme);

}  // namespace strata::train
