#include "kernels/foundation/input_file.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kernels/foundation/error.hpp"

namespace strata::core {

std::string read_input_file(const std::string& path, const std::string& what, Pipes pipe, std::size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO returns at once instead of waiting for a
  // writer; fstat then tells what was opened (no window between a check of
  // the name and the open).
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) input_error("{}: cannot read {}: {}", path, what, std::strerror(errno));
  struct stat st{};
  const bool ok = ::fstat(fd, &st) == 0;
  const bool fifo = ok && S_ISFIFO(st.st_mode) && pipe == Pipes::read;
  if (!ok || !(S_ISREG(st.st_mode) || fifo)) {
    const bool dir = ok && S_ISDIR(st.st_mode);
    ::close(fd);
    if (dir) input_error("{}: cannot read {}: it is a directory", path, what);
    input_error("{}: cannot read {}: not a regular file (a FIFO, socket or device); give a file's path", path, what);
  }
  if (!fifo && std::size_t(st.st_size) > max_bytes) {
    ::close(fd);
    input_error("{}: cannot read {}: {} bytes, more than the {} MiB a {} may hold", path, what,
                std::size_t(st.st_size), max_bytes >> 20, what);
  }
  if (fifo) {
    // A pipe with no writer yet reads as empty: wait for its first bytes
    // (or its end). No stop handler is installed while decks are read, so a
    // signal still ends the wait.
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, -1) < 0 && errno == EINTR) {
    }
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      input_error("{}: cannot read {}: {}", path, what, std::strerror(err));
    }
    if (n == 0) break;
    text.append(buf, std::size_t(n));
    if (text.size() > max_bytes) {
      ::close(fd);
      input_error("{}: cannot read {}: more than the {} MiB a {} may hold", path, what, max_bytes >> 20, what);
    }
  }
  ::close(fd);
  return text;
}

}  // namespace strata::core
