// The device arena's sub-allocator, over a host buffer: fresh random
// sequences of allocations and releases against a reference model of the
// blocks (no two live blocks overlap, every block aligned and inside the
// arena, bytes in use exact), merging of free neighbours (everything freed
// leaves one block of the whole capacity), and the error of a full or
// fragmented arena. Seed: fresh per run, printed on failure.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/foundation/arena.hpp"
#include "kernels/foundation/error.hpp"

using strata::core::Arena;

namespace {

unsigned test_seed() {
  if (const char* s = std::getenv("STRATA_TEST_SEED")) return unsigned(std::strtoul(s, nullptr, 10));
  return std::random_device{}();
}

struct Host {
  explicit Host(std::size_t bytes) : raw(bytes + 256) {}
  void* aligned() {
    const auto p = reinterpret_cast<std::uintptr_t>(raw.data());
    return reinterpret_cast<void*>((p + 255) / 256 * 256);
  }
  std::vector<std::byte> raw;
};

}  // namespace

TEST(Arena, RandomAllocationsStayDisjointAlignedAndMerge) {
  const unsigned seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (rerun with STRATA_TEST_SEED)");
  std::mt19937 rng(seed);
  const std::size_t capacity = 1 << 20;
  Host host(capacity);
  Arena a(host.aligned(), capacity);
  auto* base = static_cast<std::byte*>(host.aligned());
  std::map<std::byte*, std::size_t> live;  // block -> bytes asked
  std::size_t expect_used = 0;
  std::uniform_int_distribution<std::size_t> size(0, 20000);
  for (int i = 0; i < 5000; ++i) {
    if (!live.empty() && (rng() % 3 == 0 || a.largest_free() < 25000)) {
      auto it = live.begin();
      std::advance(it, std::ptrdiff_t(rng() % live.size()));
      a.release(it->first);
      expect_used -= (it->second == 0 ? 256 : (it->second + 255) / 256 * 256);
      live.erase(it);
    } else {
      const std::size_t n = size(rng);
      auto* p = static_cast<std::byte*>(a.allocate(n));
      ASSERT_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0u);
      ASSERT_GE(p, base);
      ASSERT_LE(p + n, base + capacity);
      // Disjoint from its neighbours in address order.
      const auto next = live.lower_bound(p);
      if (next != live.end()) {
        ASSERT_LE(p + n, next->first);
      }
      if (next != live.begin()) {
        const auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, p);
      }
      live[p] = n;
      expect_used += (n == 0 ? 256 : (n + 255) / 256 * 256);
    }
    ASSERT_EQ(a.used(), expect_used);
    ASSERT_EQ(a.blocks(), live.size());
  }
  for (const auto& [p, n] : live) a.release(p);
  EXPECT_EQ(a.used(), 0u);
  EXPECT_EQ(a.largest_free(), capacity) << "freed neighbours merge back into one block";
}

TEST(Arena, FullOrFragmentedArenaSaysWhy) {
  Host host(4096);
  Arena a(host.aligned(), 4096);
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(a.allocate(200));  // 16 x 256 B
  EXPECT_EQ(a.used(), 4096u);
  // Free every other block: 2 KiB free, but no 512 B hole.
  for (int i = 0; i < 16; i += 2) a.release(blocks[std::size_t(i)]);
  try {
    a.allocate(512);
    FAIL() << "a fragmented arena has no 512 B hole";
  } catch (const strata::core::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("no room for 512 B"), std::string::npos) << msg;
    EXPECT_NE(msg.find("2.00 KiB free of 4.00 KiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("largest free block 256 B"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(a.release(blocks[1]));  // merges with both free neighbours: 768 B
  EXPECT_EQ(a.largest_free(), 768u);
  EXPECT_NO_THROW(a.allocate(512));
  EXPECT_THROW(a.release(static_cast<std::byte*>(host.aligned()) + 8), strata::core::Error);
}
