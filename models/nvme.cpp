#include "models/nvme.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "kernels/kernels.hpp"
#include "kernels/foundation/error.hpp"
#include "kernels/foundation/clock.hpp"

namespace strata::models {

namespace {

std::atomic<int> file_counter{0};

std::byte* align_up(std::byte* p) {
  const auto a = std::uintptr_t(NvmeFile::kAlign);
  return reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(p) + a - 1) / a * a);
}

// pread/pwrite until done: a transfer may come back short.
double transfer(int fd, std::byte* buf, std::int64_t bytes, std::int64_t offset, bool write, const std::string& path) {
  const double t0 = prof::now_seconds();
  std::int64_t done = 0;
  while (done < bytes) {
    const ssize_t n = write ? ::pwrite(fd, buf + done, std::size_t(bytes - done), off_t(offset + done))
                            : ::pread(fd, buf + done, std::size_t(bytes - done), off_t(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      core::runtime_error("offload file {}: {} of {} bytes at {} failed: {}", path, write ? "write" : "read", bytes,
                          offset + done, n < 0 ? std::strerror(errno) : "end of file");
    done += n;
  }
  return prof::now_seconds() - t0;
}

}  // namespace

static std::future<double> done_now() {
  std::promise<double> p;
  p.set_value(0.0);
  return p.get_future();
}

NvmeFile::NvmeFile(const std::string& dir, core::MemoryTracker& host, std::int64_t chunk_elements, int tensors)
    : chunk_elements_(chunk_elements), host_(host) {
  STRATA_CHECK(chunk_elements % 1024 == 0, "NVMe chunk of {} elements is not a multiple of 1024", chunk_elements);
  const std::size_t bytes = std::size_t(chunk_elements_) * std::size_t(tensors) * sizeof(float);
  for (auto& b : buffers_)
    b = core::Buffer<std::byte>(host, core::MemCategory::optimizer, bytes + kAlign, "NVMe offload: chunk buffer");
  if (kernels::is_meta()) {  // a dry run: regions are counted, nothing is written
    path_ = (std::filesystem::path(dir) / "(no file: meta device)").string();
    mode_ = "meta";
    return;
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  // One file per rank (process): the pid and a counter make it unique on a
  // node's shared file system without knowing the rank.
  path_ = (std::filesystem::path(dir) / fmt::format("strata-optimizer-{}-{}.bin", ::getpid(), file_counter++)).string();
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
  if (fd_ >= 0) {
    mode_ = "O_DIRECT";
  } else {
    // tmpfs and some network file systems refuse O_DIRECT (EINVAL).
    const std::string why = std::strerror(errno);
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    mode_ = fmt::format("buffered (O_DIRECT refused by the file system: {})", why);
  }
  if (fd_ < 0)
    core::runtime_error("offload.path: cannot create the optimizer file {}: {}", path_, std::strerror(errno));
}

NvmeFile::~NvmeFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  std::error_code ec;
  std::filesystem::remove(path_, ec);
}

std::int64_t NvmeFile::reserve(std::int64_t bytes, core::MemCategory c) {
  STRATA_CHECK(bytes % kAlign == 0, "NVMe region of {} bytes is not 4096-aligned", bytes);
  const std::int64_t at = size_;
  size_ += bytes;
  bytes_[int(c)] += bytes;
  if (fd_ >= 0 && ::ftruncate(fd_, off_t(size_)) != 0)  // the new bytes read as zeros
    core::runtime_error("offload file {}: cannot grow to {} bytes: {}", path_, size_, std::strerror(errno));
  return at;
}

float* NvmeFile::buffer(int i) { return reinterpret_cast<float*>(align_up(buffers_[i].data())); }

std::int64_t NvmeFile::reserve_block(std::int64_t bytes) {
  largest_block_ = std::max(largest_block_, aligned_size(bytes));
  return reserve(aligned_size(bytes), core::MemCategory::params);
}

std::byte* NvmeFile::bounce() {
  if (bounce_.size() == 0)
    bounce_ = core::Buffer<std::byte>(host_, core::MemCategory::params, std::size_t(largest_block_ + kAlign),
                                      "NVMe offload: parameter bounce buffer");
  return align_up(bounce_.data());
}

double NvmeFile::read_block(void* dst, std::int64_t bytes, std::int64_t offset) {
  std::byte* b = bounce();
  if (fd_ < 0) return 0;
  const double took = transfer(fd_, b, aligned_size(bytes), offset, false, path_);
  kernels::copy_bytes(dst, b, std::size_t(bytes));  // dst may be device memory
  return took;
}

double NvmeFile::write_block(const void* src, std::int64_t bytes, std::int64_t offset) {
  std::byte* b = bounce();
  if (fd_ < 0) return 0;
  kernels::copy_bytes(b, src, std::size_t(bytes));
  std::memset(b + bytes, 0, std::size_t(aligned_size(bytes) - bytes));
  return transfer(fd_, b, aligned_size(bytes), offset, true, path_);
}

std::future<double> NvmeFile::read_async(void* buf, std::int64_t bytes, std::int64_t offset) {
  if (fd_ < 0) return done_now();
  return std::async(std::launch::async, transfer, fd_, static_cast<std::byte*>(buf), bytes, offset, false, path_);
}

std::future<double> NvmeFile::write_async(const void* buf, std::int64_t bytes, std::int64_t offset) {
  if (fd_ < 0) return done_now();
  return std::async(std::launch::async, transfer, fd_, static_cast<std::byte*>(const_cast<void*>(buf)), bytes,
                    offset, true, path_);
}

}  // namespace strata::models
