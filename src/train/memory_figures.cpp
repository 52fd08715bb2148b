#include "src/train/memory_figures.hpp"

#include <fmt/format.h>

namespace strata::train {

std::uint64_t PoolFigures::total_held() const {
  std::uint64_t sum = 0;
  for (auto b : held) sum += b;
  return sum;
}

std::string describe(const RankMemory& m) {
  std::string out;
  for (int p = 0; p < core::kNumPools; ++p) {
    const PoolFigures& f = m.pools[std::size_t(p)];
    for (int c = 0; c < core::kNumMemCategories; ++c)
      if (f.held[std::size_t(c)] != 0 || f.peak[std::size_t(c)] != 0)
        out += fmt::format("{} {}: held {} B, peak {} B; ", core::pool_name(core::Pool(p)),
                           core::category_name(core::MemCategory(c)), f.held[std::size_t(c)], f.peak[std::size_t(c)]);
    if (f.total_peak != 0) out += fmt::format("{} total peak {} B; ", core::pool_name(core::Pool(p)), f.total_peak);
  }
  return out;
}

namespace {
PoolFigures from_tracker(const core::MemoryTracker& t) {
  PoolFigures f;
  for (int c = 0; c < core::kNumMemCategories; ++c) {
    f.held[std::size_t(c)] = t.current(core::MemCategory(c));
    f.peak[std::size_t(c)] = t.peak(core::MemCategory(c));
  }
  f.total_peak = t.total_peak();
  return f;
}
}  // namespace

RankMemory rank_memory(const core::MemoryTracker& device, const core::MemoryTracker& host,
                       const models::NvmeFile* nvme) {
  RankMemory m;
  m[core::Pool::device] = from_tracker(device);
  m[core::Pool::host] = from_tracker(host);
  if (nvme != nullptr) {
    PoolFigures& f = m[core::Pool::nvme];
    for (int c = 0; c < core::kNumMemCategories; ++c)
      f.held[std::size_t(c)] = f.peak[std::size_t(c)] = std::uint64_t(nvme->bytes(core::MemCategory(c)));
    f.total_peak = std::uint64_t(nvme->size());
  }
  return m;
}

}  // namespace strata::train
