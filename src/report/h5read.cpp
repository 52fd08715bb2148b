#include "src/report/h5read.hpp"

#include <hdf5.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <vector>

namespace strata::report {
namespace {

// Whether an attribute's or dataset's dataspace holds exactly one element:
// a reader of one value must not read an array (into one value's room).
bool one_element(hid_t space) {
  const bool one = space >= 0 && H5Sget_simple_extent_npoints(space) == 1;
  if (space >= 0) H5Sclose(space);
  return one;
}

// A status or an error message is far shorter; a damaged file may claim more.
constexpr std::size_t kLongestString = 1 << 20;

std::string read_string_attr(hid_t file, const char* name) {
  if (H5Aexists(file, name) <= 0) return "";
  const hid_t a = H5Aopen(file, name, H5P_DEFAULT);
  if (a < 0) return "";
  if (!one_element(H5Aget_space(a))) {
    H5Aclose(a);
    return "";
  }
  const hid_t t = H5Aget_type(a);
  std::string out;
  if (t < 0) {
    H5Aclose(a);
    return "";
  }
  if (H5Tget_class(t) == H5T_STRING && H5Tis_variable_str(t) > 0) {
    char* text = nullptr;
    if (H5Aread(a, t, &text) >= 0 && text != nullptr) out = text;
    H5free_memory(text);
  } else if (H5Tget_class(t) == H5T_STRING && H5Tget_size(t) <= kLongestString) {
    std::vector<char> buf(H5Tget_size(t) + 1, '\0');
    if (H5Aread(a, t, buf.data()) >= 0) out = buf.data();
  }
  H5Tclose(t);
  H5Aclose(a);
  return out;
}

double read_scalar(hid_t file, const char* path) {
  double v = 0;
  if (H5Lexists(file, "summary", H5P_DEFAULT) <= 0 || H5Lexists(file, path, H5P_DEFAULT) <= 0) return 0;
  const hid_t d = H5Dopen(file, path, H5P_DEFAULT);
  if (d < 0) return 0;
  const hid_t t = H5Dget_type(d);
  const bool number = t >= 0 && (H5Tget_class(t) == H5T_FLOAT || H5Tget_class(t) == H5T_INTEGER);
  if (t >= 0) H5Tclose(t);
  if (!number || !one_element(H5Dget_space(d)) ||
      H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v) < 0)
    v = 0;
  H5Dclose(d);
  return v;
}

}  // namespace

namespace {

std::optional<Headline> read_in_process(const std::string& path) {
  std::optional<Headline> out;
  // A file that is not HDF5 is "no report", not an error to print.
  H5E_BEGIN_TRY {
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f >= 0) {
      Headline h;
      h.status = read_string_attr(f, "status");
      h.error = read_string_attr(f, "error");
      h.tokens_per_s = read_scalar(f, "/summary/tokens_per_s");
      h.mfu = read_scalar(f, "/summary/mfu");
      h.step_time = read_scalar(f, "/summary/step_time");
      h.final_loss = read_scalar(f, "/summary/final_loss");
      h.peak_bytes_total = read_scalar(f, "/summary/peak_bytes_total");
      H5Fclose(f);
      out = h;
    }
  }
  H5E_END_TRY;
  return out;
}

bool write_all(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w, n -= std::size_t(w);
  }
  return true;
}

}  // namespace

std::optional<Headline> read_headline(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  // HDF5 crashes on some damaged files (a corrupted global heap fails in
  // H5HG_read), and a sweep must not die of a point's damaged report: the
  // file is read in a child, which sends the figures back through a pipe.
  // A child that dies leaves "no readable report".
  int fds[2];
  if (::pipe(fds) != 0) return read_in_process(path);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]), ::close(fds[1]);
    return read_in_process(path);
  }
  if (pid == 0) {
    ::close(fds[0]);
    const std::optional<Headline> h = read_in_process(path);
    std::string msg;
    if (h) {
      const double v[5] = {h->tokens_per_s, h->mfu, h->step_time, h->final_loss, h->peak_bytes_total};
      const std::uint64_t sizes[2] = {h->status.size(), h->error.size()};
      msg.append(reinterpret_cast<const char*>(v), sizeof v).append(reinterpret_cast<const char*>(sizes), sizeof sizes);
      msg += h->status + h->error;
    }
    ::_exit(write_all(fds[1], msg.data(), msg.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  std::string msg;
  char buf[4096];
  for (;;) {
    const ssize_t r = ::read(fds[0], buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    msg.append(buf, std::size_t(r));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  constexpr std::size_t kFixed = 5 * sizeof(double) + 2 * sizeof(std::uint64_t);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || msg.size() < kFixed) return std::nullopt;
  Headline h;
  double v[5];
  std::uint64_t sizes[2];
  std::memcpy(v, msg.data(), sizeof v);
  std::memcpy(sizes, msg.data() + sizeof v, sizeof sizes);
  if (msg.size() != kFixed + sizes[0] + sizes[1]) return std::nullopt;
  h.tokens_per_s = v[0], h.mfu = v[1], h.step_time = v[2], h.final_loss = v[3], h.peak_bytes_total = v[4];
  h.status = msg.substr(kFixed, sizes[0]);
  h.error = msg.substr(kFixed + sizes[0], sizes[1]);
  return h;
}

}  // namespace strata::report
