#include "kernels/foundation/arena.hpp"

#include <iterator>

#include "kernels/foundation/error.hpp"
#include "kernels/foundation/memory.hpp"

namespace strata::core {

Arena::Arena(void* base, std::size_t capacity, std::size_t alignment)
    : base_(static_cast<std::byte*>(base)), capacity_(capacity), alignment_(alignment) {
  STRATA_CHECK(alignment_ > 0 && (alignment_ & (alignment_ - 1)) == 0, "arena alignment {} is not a power of two",
               alignment_);
  STRATA_CHECK(reinterpret_cast<std::uintptr_t>(base_) % alignment_ == 0, "arena base is not {}-byte aligned",
               alignment_);
  capacity_ -= capacity_ % alignment_;
  if (capacity_ > 0) free_[0] = capacity_;
}

std::size_t Arena::largest_free() const {
  std::size_t most = 0;
  for (const auto& [at, size] : free_) most = size > most ? size : most;
  return most;
}

void* Arena::allocate(std::size_t bytes) {
  const std::size_t want = ((bytes == 0 ? 1 : bytes) + alignment_ - 1) / alignment_ * alignment_;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < want) continue;
    const std::size_t at = it->first, left = it->second - want;
    free_.erase(it);
    if (left > 0) free_[at + want] = left;
    used_blocks_[at] = want;
    used_ += want;
    return base_ + at;
  }
  runtime_error("device arena: no room for {} ({} free of {}, largest free block {})", format_bytes(double(want)),
                format_bytes(double(capacity_ - used_)), format_bytes(double(capacity_)),
                format_bytes(double(largest_free())));
}

void Arena::release(void* p) {
  const std::size_t at = std::size_t(static_cast<std::byte*>(p) - base_);
  const auto u = used_blocks_.find(at);
  STRATA_CHECK(static_cast<std::byte*>(p) >= base_ && u != used_blocks_.end(),
               "device arena: release of a block it did not hand out (offset {})", at);
  std::size_t begin = at, size = u->second;
  used_ -= size;
  used_blocks_.erase(u);
  // Merge with the free neighbours on either side.
  auto next = free_.lower_bound(begin);
  if (next != free_.end() && next->first == begin + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    const auto prev = std::prev(next);
    if (prev->first + prev->second == begin) {
      begin = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_[begin] = size;
}

}  // namespace strata::core
