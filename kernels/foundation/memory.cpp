#include "kernels/foundation/memory.hpp"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "kernels/foundation/arena.hpp"
#include "kernels/foundation/error.hpp"

namespace strata::core {

const char* category_name(MemCategory c) {
  switch (c) {
    case MemCategory::params: return "params";
    case MemCategory::grads: return "grads";
    case MemCategory::optimizer: return "optimizer";
    case MemCategory::activations: return "activations";
    case MemCategory::workspace: return "workspace";
    case MemCategory::comm: return "comm";
    case MemCategory::count: break;
  }
  return "?";
}

const char* pool_name(Pool p) {
  switch (p) {
    case Pool::device: return "device";
    case Pool::host: return "host";
    case Pool::nvme: return "nvme";
    case Pool::count: break;
  }
  return "?";
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, units[u]);
}

std::string MemoryTracker::breakdown() const {
  std::string s;
  for (int i = 0; i < kNumMemCategories; ++i) {
    if (!s.empty()) s += ", ";
    s += fmt::format("{} {}", category_name(static_cast<MemCategory>(i)), format_bytes(double(current_[i])));
  }
  return s;
}

MemoryTracker::MemoryTracker(std::size_t limit_bytes, std::string_view limit_name)
    : limit_(limit_bytes), limit_name_(limit_name) {}
MemoryTracker::~MemoryTracker() = default;

void MemoryTracker::use_arena(void* base, std::size_t capacity, void (*zero)(void*, std::size_t)) {
  STRATA_CHECK(total_current_ == 0 && arena_ == nullptr, "a device arena after the first allocation");
  arena_ = std::make_unique<Arena>(base, capacity);
  zero_ = zero;
}

void MemoryTracker::count_only() {
  STRATA_CHECK(total_current_ == 0 && arena_ == nullptr, "count_only after the first allocation");
  // Far above any heap or mapping of this process, so a stray dereference
  // faults instead of reading something.
  fake_next_ = std::uintptr_t(1) << 46;
}

std::size_t MemoryTracker::arena_capacity() const { return arena_ ? arena_->capacity() : 0; }

void* MemoryTracker::allocate(MemCategory c, std::size_t bytes, std::string_view what) {
  if (limit_ != 0 && total_current_ + bytes > limit_) {
    throw Error(ErrorKind::runtime,
                fmt::format("out of memory: {} ({}) needs {} but {} of the {} limit ({}) is in use [{}]", what,
                            category_name(c), format_bytes(double(bytes)), format_bytes(double(total_current_)),
                            format_bytes(double(limit_)), limit_name_, breakdown()));
  }
  void* p = nullptr;
  if (fake_next_ != 0 && bytes > 0) {
    p = reinterpret_cast<void*>(fake_next_);
    fake_next_ += (bytes + 255) / 256 * 256;
  } else if (arena_ && bytes > 0) {
    // The arena's blocks start on 256 bytes (cudaMalloc's alignment).
    try {
      p = arena_->allocate(bytes);
    } catch (const Error& e) {
      throw Error(ErrorKind::runtime, fmt::format("{} ({}): {} [{}]", what, category_name(c), e.what(), breakdown()));
    }
    zero_(p, bytes);
  } else if (bytes > 0) {
    // 64-byte alignment: a cache line, and what vector kernels want.
    const std::size_t rounded = (bytes + 63) / 64 * 64;
    p = std::aligned_alloc(64, rounded);
    if (p == nullptr) runtime_error("host allocation of {} for {} failed", format_bytes(double(bytes)), what);
    std::memset(p, 0, rounded);
  }
  current_[idx(c)] += bytes;
  total_current_ += bytes;
  if (current_[idx(c)] > peak_[idx(c)]) peak_[idx(c)] = current_[idx(c)];
  if (total_current_ > total_peak_) total_peak_ = total_current_;
  return p;
}

void MemoryTracker::release(MemCategory c, void* p, std::size_t bytes) {
  if (fake_next_ != 0)
    ;  // nothing behind it
  else if (arena_ && p != nullptr)
    arena_->release(p);
  else
    std::free(p);
  current_[idx(c)] -= bytes;
  total_current_ -= bytes;
}

void MemoryTracker::reset_peaks() {
  peak_ = current_;
  total_peak_ = total_current_;
}

}  // namespace strata::core
