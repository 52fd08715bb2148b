// NVMe offload's backing store (ZeRO-Infinity's division of labour): one
// file per rank under `offload.path`, in which every AdamW of the rank owns
// a region for its moments (and, in mixed precision, master weights), laid
// out chunk by chunk: chunk c holds K elements of m, then of v, then of the
// master weights, so that one read and one write move a chunk's whole state.
// The file is opened with O_DIRECT (bypassing the page cache, what NVMe
// offload wants) where the file system allows, buffered otherwise, and says
// which (`mode()`); every transfer is a whole chunk at a 4096-byte aligned
// offset from a 4096-byte aligned buffer, as O_DIRECT requires. The two
// chunk buffers (double buffering: one being computed on while the other
// is read or written) come from the host arena and are shared by the rank's
// optimizers, whose updates run one after the other. The file is removed
// when the run ends. On the meta device (a dry run) there is no file: regions
// are only counted and transfers do nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <future>
#include <string>

#include "kernels/foundation/memory.hpp"

namespace strata::models {

class NvmeFile {
 public:
  static constexpr std::int64_t kAlign = 4096;
  // `chunk_elements` (a multiple of 1024) per tensor per chunk; `tensors`
  // per chunk (2: m, v; 3: with the master weights).
  NvmeFile(const std::string& dir, core::MemoryTracker& host, std::int64_t chunk_elements, int tensors);
  ~NvmeFile();
  NvmeFile(const NvmeFile&) = delete;
  NvmeFile& operator=(const NvmeFile&) = delete;

  // A region of `bytes` (a multiple of kAlign) at the end of the file,
  // zero-filled, holding state of category `c`; returns its offset.
  std::int64_t reserve(std::int64_t bytes, core::MemCategory c = core::MemCategory::optimizer);
  // `bytes` rounded up to whole kAlign blocks: what a transfer moves.
  static std::int64_t aligned_size(std::int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
  // Blocks (ZeRO-3's parameter blocks): a region for up to `bytes`, and
  // synchronous transfers of `bytes` to or from one through an aligned
  // bounce buffer in the host arena, sized for the largest block and taken
  // at the first transfer; each returns the seconds it took.
  std::int64_t reserve_block(std::int64_t bytes);
  double read_block(void* dst, std::int64_t bytes, std::int64_t offset);
  double write_block(const void* src, std::int64_t bytes, std::int64_t offset);
  // Asynchronous whole-buffer transfers (on their own thread); the future
  // gives the seconds the transfer took.
  std::future<double> read_async(void* buf, std::int64_t bytes, std::int64_t offset);
  std::future<double> write_async(const void* buf, std::int64_t bytes, std::int64_t offset);

  std::int64_t chunk_elements() const { return chunk_elements_; }
  // Chunk buffer i (0 or 1): chunk_elements x tensors floats, 4096-aligned.
  float* buffer(int i);
  const std::string& path() const { return path_; }
  const std::string& mode() const { return mode_; }  // "O_DIRECT", or "buffered (...why...)"
  std::int64_t size() const { return size_; }
  // The file's bytes holding category c: the optimizer's regions, and with
  // offload.params ZeRO-3's parameter blocks (params). The file's memory
  // pool in the report.
  std::int64_t bytes(core::MemCategory c) const { return bytes_[int(c)]; }

 private:
  std::string path_, mode_;
  int fd_ = -1;
  std::int64_t size_ = 0;
  std::int64_t bytes_[core::kNumMemCategories] = {};
  std::int64_t chunk_elements_;
  core::MemoryTracker& host_;
  // Each over-allocated by kAlign and used from its first aligned byte.
  core::Buffer<std::byte> buffers_[2], bounce_;
  std::int64_t largest_block_ = 0;
  std::byte* bounce();
};

// The chunk elements of `chunk_mb` MiB per state tensor: whole 4 KiB pages
// (1024 floats each), at least one.
inline std::int64_t nvme_chunk_elements(double chunk_mb) {
  const auto pages = std::int64_t(chunk_mb * 256.0);
  return (pages > 1 ? pages : 1) * 1024;
}

}  // namespace strata::models
