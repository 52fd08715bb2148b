#include "src/report/output_path.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>

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

namespace {

// The absolute path `path` names once every symbolic link along it is
// followed, a dangling one too (fs::weakly_canonical stops at the first
// component that does not exist, so a link to a file not yet written would
// hide what it points at), then "." and ".." removed.
fs::path resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  for (int hop = 0; hop < 40; ++hop) {  // as the kernel's limit on links followed
    fs::path built;
    bool followed = false;
    for (auto it = p.begin(); it != p.end() && !followed; ++it) {
      built /= *it;
      if (!fs::is_symlink(fs::symlink_status(built, ec))) continue;
      const fs::path target = fs::read_symlink(built, ec);
      if (ec) break;
      fs::path rest;
      for (auto j = std::next(it); j != p.end(); ++j) rest /= *j;
      p = (target.is_absolute() ? target : built.parent_path() / target) / rest;
      followed = true;
    }
    // ".." only once the links before it are followed: "link/.." is the
    // link target's parent.
    if (!followed) break;
  }
  return p.lexically_normal();
}

}  // namespace

bool same_file(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  std::error_code ec;
  if (fs::equivalent(a, b, ec)) return true;
  return resolved(a) == resolved(b);
}

bool inside(const std::string& path, const std::string& dir) {
  if (path.empty() || dir.empty()) return false;
  const fs::path p = resolved(path), d = resolved(dir);
  // Component by component: "ck2" is not inside "ck".
  auto pi = p.begin();
  for (auto di = d.begin(); di != d.end(); ++di, ++pi) {
    if (di->empty() && std::next(di) == d.end()) return pi != p.end();  // a trailing "/"
    if (pi == p.end() || *pi != *di) return false;
  }
  return pi != p.end();
}

std::string output_file_problem(const std::string& path, const std::string& what, const std::vector<Input>& inputs) {
  if (path.empty()) return "an empty path";
  for (const Input& in : inputs) {
    if (same_file(path, in.path))
      return fmt::format("is {} ({}): the {} would overwrite it", in.what, in.path, what);
    std::error_code ec;
    if ((in.directory || fs::is_directory(in.path, ec)) && inside(path, in.path))
      return fmt::format("lies inside {} ({}): the {} would take the place of what is kept there", in.what, in.path,
                         what);
  }
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

namespace {

bool taken(const std::string& path) {
  std::error_code ec;
  for (const char* suffix : {"", ".lock", ".partial"})
    if (fs::exists(fs::symlink_status(path + suffix, ec))) return true;
  return false;
}

}  // namespace

ReportPath choose_report_path(const std::string& named, const std::string& fallback, bool replace,
                              const std::string& what, const std::vector<Input>& inputs) {
  ReportPath out{named.empty() ? fallback : named, "", ""};
  if (named.empty() && taken(fallback)) {
    const fs::path p(fallback);
    const std::string stem = (p.parent_path() / p.stem()).string(), ext = p.extension().string();
    // Past ten thousand earlier reports of one name, a name is asked for.
    for (int n = 2; n <= 10000 && out.path == fallback; ++n)
      if (const std::string next = fmt::format("{}-{}{}", stem, n, ext); !taken(next)) out.path = next;
    if (out.path == fallback) {
      out.problem = fmt::format("it and {}-2{} to {}-10000{} are taken; --output names another", stem, ext, stem, ext);
      return out;
    }
    out.note = fmt::format("{} exists: this {} goes to {} (--output names the path; --force with it replaces a file)",
                           fallback, what, out.path);
  }
  out.problem = output_file_problem(out.path, what, inputs);
  std::error_code ec;
  if (out.problem.empty() && !named.empty() && !replace && fs::exists(fs::symlink_status(named, ec)))
    out.problem = "a file is there, and an earlier report is never replaced silently: --force replaces it, or --output "
                  "names another path";
  return out;
}

}  // namespace strata::report
