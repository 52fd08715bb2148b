#include "src/train/data.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "models/init.hpp"
#include "kernels/foundation/error.hpp"

namespace strata::train {

using models::mix64;

namespace {

// Uniform token ids: a check of throughput and of parity, not of learning
// (the loss cannot fall below log V on noise).
class SyntheticData final : public DataSource {
 public:
  SyntheticData(std::uint64_t seed, int vocab) : seed_(seed), vocab_(vocab) {}
  void sample(std::int64_t index, int T, std::int32_t* out) const override {
    const std::uint64_t base = mix64(seed_ ^ mix64(std::uint64_t(index)));
    for (int t = 0; t <= T; ++t) out[t] = std::int32_t(mix64(base + std::uint64_t(t)) % std::uint64_t(vocab_));
  }
  std::string describe() const override { return fmt::format("synthetic (uniform ids < {})", vocab_); }

 private:
  std::uint64_t seed_;
  int vocab_;
};

// Byte-level text: sample i is the window of T + 1 bytes at a keyed offset,
// read from the file when it is asked for. Nothing is loaded up front: a
// text of gigabytes costs no memory and no start-up wait (a wait no stop
// signal could end before step 1).
class TextData final : public DataSource {
 public:
  TextData(std::uint64_t seed, const std::string& path) : seed_(seed), path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st{};
    if (fd_ < 0 || ::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      if (fd_ >= 0) ::close(fd_);
      core::input_error("data.path: cannot read '{}' as a file", path);
    }
    size_ = std::uint64_t(st.st_size);
  }
  ~TextData() override { ::close(fd_); }
  TextData(const TextData&) = delete;
  TextData& operator=(const TextData&) = delete;
  void sample(std::int64_t index, int T, std::int32_t* out) const override {
    STRATA_CHECK(size_ > std::uint64_t(T), "text shorter than a sequence");
    const std::uint64_t windows = size_ - std::uint64_t(T);  // offsets 0 .. size - T - 1
    const std::uint64_t off = mix64(seed_ ^ mix64(std::uint64_t(index))) % windows;
    std::vector<unsigned char> w(std::size_t(T) + 1);
    std::size_t got = 0;
    while (got < w.size()) {
      const ssize_t n = ::pread(fd_, w.data() + got, w.size() - got, off_t(off + got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        core::runtime_error("data.path '{}': cannot read {} bytes at offset {}: {}", path_, w.size(), off,
                            n == 0 ? "the file is shorter than when the run began" : std::strerror(errno));
      got += std::size_t(n);
    }
    for (int t = 0; t <= T; ++t) out[t] = std::int32_t(w[std::size_t(t)]);
  }
  std::string describe() const override { return fmt::format("text '{}' ({} bytes)", path_, size_); }

 private:
  std::uint64_t seed_;
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

}  // namespace

std::unique_ptr<DataSource> make_data_source(const plan::Plan& config) {
  // The data stream has its own key, so changing the model does not change the data.
  const std::uint64_t seed = mix64(config.run.seed ^ 0xda7aULL);
  if (config.data.source == plan::DataSource::text) return std::make_unique<TextData>(seed, config.data.path);
  return std::make_unique<SyntheticData>(seed, config.model.vocab);
}

void fill_batch(const DataSource& data, std::int64_t first_sample, int B, int T, std::int32_t* tokens,
                std::int32_t* targets) {
  std::vector<std::int32_t> buf(std::size_t(T) + 1);
  for (int b = 0; b < B; ++b) {
    data.sample(first_sample + b, T, buf.data());
    for (int t = 0; t < T; ++t) {
      tokens[std::size_t(b) * T + t] = buf[t];
      targets[std::size_t(b) * T + t] = buf[t + 1];
    }
  }
}

}  // namespace strata::train
