#include "src/report/claim.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace fs = std::filesystem;

namespace strata::report {

namespace {

std::string host_name() {
  char h[256] = {};
  ::gethostname(h, sizeof h - 1);
  return h;
}

}  // namespace

std::string take_claim(const std::string& path, const std::string& lock, const char* what, std::string* content,
                       std::string* said) {
  *content = fmt::format("{} {}\n", host_name(), ::getpid());
  std::error_code ec;
  if (const fs::path parent = fs::path(lock).parent_path(); !parent.empty()) fs::create_directories(parent, ec);
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int fd = ::open(lock.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) {
      const bool written = ::write(fd, content->data(), content->size()) == ssize_t(content->size());
      ::close(fd);
      if (written) return "";
      ::unlink(lock.c_str());
      return fmt::format("{} {}: cannot write its claim {}", what, path, lock);
    }
    if (errno != EEXIST) return fmt::format("{} {}: cannot create its claim {}: {}", what, path, lock, std::strerror(errno));
    // Held: by a live process, or left by one that died (SIGKILL, a node lost).
    std::ifstream in(lock);
    std::string host;
    long pid = 0;
    in >> host >> pid;
    // A claim is "host pid" in printable characters; anything else was
    // written by something other than a run.
    const bool printable = std::all_of(host.begin(), host.end(), [](unsigned char c) { return c > 32 && c < 127; });
    if (host.empty() || !printable || pid <= 0)
      return fmt::format("{} {}: its claim {} is not a run's claim (a run writes \"host pid\" there); if no run "
                         "is writing {}, remove {}",
                         what, path, lock, path, lock);
    const bool here = host == host_name();
    if (here && ::kill(pid_t(pid), 0) != 0 && errno == ESRCH && attempt == 0) {
      *said = fmt::format("{} {}: removed a stale claim of process {} (no longer running)\n", what, path, pid);
      ::unlink(lock.c_str());
      continue;
    }
    return fmt::format("{} {} is claimed by another run: process {} on {} ({}){}", what, path, pid, host, lock,
                       here ? "" : "; if that run is over, remove the claim file");
  }
  return fmt::format("{} {}: its claim {} was taken again while a stale one was removed", what, path, lock);
}

void release_claim(const std::string& lock, const std::string& content) {
  std::ifstream in(lock);
  std::stringstream ss;
  ss << in.rdbuf();
  if (in && ss.str() == content) ::unlink(lock.c_str());
}

}  // namespace strata::report
