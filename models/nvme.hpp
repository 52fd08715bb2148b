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
// when the run ends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <future>
#include <string>

#include "src/core/memory.hpp"

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
  // zero-filled; returns its offset.
  std::int64_t reserve(std::int64_t bytes);
  // Asynchronous whole-buffer transfers (on their own thread); the future
  // gives the seconds the transfer took.
  std::future<double> read_async(void* buf, std::int64_t bytes, std::int64_t offset);
  std::future<double> write_async(const void* buf, std::int64_t bytes, std::int64_t offset);

  std::int64_t chunk_elements() const { return chunk_elements_; }
  int tensors() const { return tensors_; }
  // Chunk buffer i (0 or 1): chunk_elements x tensors floats, 4096-aligned.
  float* buffer(int i);
  const std::string& path() const { return path_; }
  const std::string& mode() const { return mode_; }  // "O_DIRECT", or "buffered (...why...)"
  std::int64_t size() const { return size_; }

 private:
  std::string path_, mode_;
  int fd_ = -1;
  std::int64_t size_ = 0;
  std::int64_t chunk_elements_;
  int tensors_;
  core::Buffer<std::byte> buffers_[2];  // over-allocated by kAlign for alignment
};

}  // namespace strata::models
