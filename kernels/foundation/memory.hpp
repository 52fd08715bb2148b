// Memory accounting: every buffer of a run comes from a MemoryTracker and is
// tagged with a category, so that the report can state current and peak bytes
// per category and the state-seam strategies (ZeRO, offload) can be checked
// against their analytical figures to the byte.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace strata::core {

class Arena;

enum class MemCategory : int { params = 0, grads, optimizer, activations, workspace, comm, count };
inline constexpr int kNumMemCategories = static_cast<int>(MemCategory::count);

const char* category_name(MemCategory c);

// Where bytes live: the device (the tracker every buffer of the model and
// the strategies comes from; host memory on the CPU backend), the host
// arena of optimizer offload (a tracker of its own), and the NVMe file.
enum class Pool : int { device = 0, host, nvme, count };
inline constexpr int kNumPools = static_cast<int>(Pool::count);
const char* pool_name(Pool p);

class MemoryTracker {
 public:
  // limit_bytes == 0 means no limit. A request that would take the tracked
  // total over the limit fails with the per-category breakdown, as a device
  // of that size would.
  // `limit_name`: the deck key the limit comes from, named when a request
  // exceeds it.
  explicit MemoryTracker(std::size_t limit_bytes = 0, std::string_view limit_name = "backend.memory_limit");
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  ~MemoryTracker();

  // From now on (before the first allocation) buffers are placed in a
  // device arena over [base, base + capacity): one region the caller took
  // from the device (kernels::device_alloc) and frees after this tracker,
  // zeroed through `zero` (a device memset; core cannot call the kernels).
  // Without it buffers are host memory.
  void use_arena(void* base, std::size_t capacity, void (*zero)(void*, std::size_t));
  bool on_arena() const { return arena_ != nullptr; }
  // From now on (before the first allocation) buffers have no memory behind
  // them, as on the meta device of a dry run: each gets an address of its
  // own that must never be dereferenced, and its bytes count as a real
  // buffer's would.
  void count_only();
  bool counting_only() const { return fake_next_ != 0; }
  std::size_t arena_capacity() const;

  // Zeroed memory for `bytes` of category c.
  void* allocate(MemCategory c, std::size_t bytes, std::string_view what);
  void release(MemCategory c, void* p, std::size_t bytes);

  std::size_t current(MemCategory c) const { return current_[idx(c)]; }
  std::size_t peak(MemCategory c) const { return peak_[idx(c)]; }
  std::size_t total_current() const { return total_current_; }
  std::size_t total_peak() const { return total_peak_; }
  std::size_t limit() const { return limit_; }
  void set_limit(std::size_t bytes) { limit_ = bytes; }
  // Start of a measurement window (a step): peaks restart from what is held now.
  void reset_peaks();
  // "params 1.2 MiB, grads 1.2 MiB, ..." for error messages and dry runs.
  std::string breakdown() const;

 private:
  static int idx(MemCategory c) { return static_cast<int>(c); }
  std::size_t limit_;
  std::string limit_name_;
  std::array<std::size_t, kNumMemCategories> current_{};
  std::array<std::size_t, kNumMemCategories> peak_{};
  std::size_t total_current_ = 0;
  std::size_t total_peak_ = 0;
  std::unique_ptr<Arena> arena_;
  void (*zero_)(void*, std::size_t) = nullptr;
  std::uintptr_t fake_next_ = 0;  // count_only: the next address handed out
};

// "1.50 MiB": bytes in binary units for people.
std::string format_bytes(double bytes);

// An owning, tracked, 64-byte aligned array of T. Move-only; returns its bytes
// to the tracker when destroyed.
template <typename T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(MemoryTracker& tracker, MemCategory c, std::size_t n, std::string_view what)
      : tracker_(&tracker), category_(c), n_(n) {
    data_ = static_cast<T*>(tracker.allocate(c, n * sizeof(T), what));
  }
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      tracker_ = std::exchange(o.tracker_, nullptr);
      category_ = o.category_;
      data_ = std::exchange(o.data_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void reset() {
    if (data_ != nullptr) tracker_->release(category_, data_, n_ * sizeof(T));
    data_ = nullptr;
    n_ = 0;
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return n_; }
  std::size_t bytes() const { return n_ * sizeof(T); }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }
  MemCategory category() const { return category_; }

 private:
  MemoryTracker* tracker_ = nullptr;
  MemCategory category_ = MemCategory::workspace;
  T* data_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace strata::core
