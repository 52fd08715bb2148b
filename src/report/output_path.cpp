#include "src/report/output_path.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace fs = std::filesystem;

namespace strata::report {

std::string writable_place(const fs::path& dir) {
  std::error_code ec;
  fs::path p = dir.empty() ? fs::path(".") : dir;
  while (!fs::exists(p, ec) && p.has_parent_path() && p != p.parent_path()) p = p.parent_path();
  if (!fs::exists(p, ec)) p = ".";
  if (!fs::is_directory(p, ec)) return fmt::format("{} is not a directory", p.string());
  if (::access(p.c_str(), W_OK | X_OK) != 0)
    return fmt::format("the directory {} is not writable: {}", p.string(), std::strerror(errno));
  return "";
}

std::string output_file_problem(const std::string& path, const std::string& what) {
  if (path.empty()) return "an empty path";
  std::error_code ec;
  const fs::path p(path);
  const fs::file_status st = fs::status(p, ec);
  if (fs::is_directory(st)) return fmt::format("is a directory; give the {}'s file name", what);
  if (fs::exists(st) && !fs::is_regular_file(st))
    return "exists and is not a regular file (a device, FIFO or socket): give a file's path";
  for (const char* suffix : {".lock", ".partial"}) {
    const std::string s(suffix);
    if (path.size() >= s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0)
      return fmt::format("ends in \"{}\", the name of {}, never an output", s,
                         s == ".lock" ? "a run's claim on a path" : "a file being written");
  }
  return writable_place(p.parent_path());
}

}  // namespace strata::report
