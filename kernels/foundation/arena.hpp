// A sub-allocator over one contiguous block: what the CUDA backend's device
// arena places its buffers in (one cudaMalloc at start-up, every tracked
// buffer an offset in it, so allocation costs no driver call and the
// footprint is fixed and known), written over a plain address range so that
// it is tested on any machine. First fit over an address-ordered free list;
// freed blocks merge with free neighbours, so freeing everything leaves one
// block of the whole capacity. Every block starts on `alignment` bytes
// (256 by default: cudaMalloc's own alignment, enough for any vector load).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

namespace strata::core {

class Arena {
 public:
  Arena(void* base, std::size_t capacity, std::size_t alignment = 256);

  // A block of at least `bytes` (rounded up to the alignment), or an error
  // naming the request, the free bytes and the largest free block (a
  // fragmented arena can have enough bytes and still no room).
  void* allocate(std::size_t bytes);
  // `p` must be a block this arena handed out and not yet released.
  void release(void* p);

  std::size_t capacity() const { return capacity_; }
  std::size_t used() const { return used_; }
  std::size_t largest_free() const;
  std::size_t blocks() const { return used_blocks_.size(); }

 private:
  std::byte* base_;
  std::size_t capacity_, alignment_;
  std::size_t used_ = 0;
  std::map<std::size_t, std::size_t> free_;         // offset -> size, address order
  std::map<std::size_t, std::size_t> used_blocks_;  // offset -> size
};

}  // namespace strata::core
