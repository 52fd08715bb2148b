// Whether a path may take a file this program writes (a report, a plan, a
// machine description), checked before any work so that a bad path is an
// input error (exit 2) and not a failure after minutes of it, and so that no
// command ever writes over what it reads.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace strata::report {

// A file or directory a command reads (the deck, its data, a machine
// description, the checkpoint it resumes) or a directory it owns (the
// checkpoint directory it writes): an output may be neither it nor, for a
// directory, anything inside it. `what` names it in the refusal ("the deck",
// "data.path", "--resume").
struct Input {
  std::string path;
  std::string what;
  bool directory = false;  // a directory, whether or not it exists yet
};

// Whether `a` and `b` name one file: the same inode where both exist, else
// the same normalised path (a link, "./" or "dir/../" does not hide it).
bool same_file(const std::string& a, const std::string& b);
// Whether `path` lies inside the directory `dir` (at any depth), once both
// are normalised and their links resolved.
bool inside(const std::string& path, const std::string& dir);

// Why `path` cannot be an output file, or "" when it can: it is (or lies
// inside) one of `inputs`; it is a directory; it exists and is not a regular
// file (a device, a FIFO or a socket, which the write would replace or block
// on); its name ends in ".lock" or ".partial" (a run's claim on a path and a
// file being written: never outputs, and writing one would take another
// run's place); or its directory can neither be written nor made.
// `what` names the file in the directory case ("report": "give the
// report's file name").
std::string output_file_problem(const std::string& path, const std::string& what,
                                const std::vector<Input>& inputs = {});

// Where a command's report goes, by one rule for run, simulate and plan,
// so that no earlier report is ever replaced silently: a path the user
// named (`named`: --output or run.output) as it is, refused while a file is
// there unless `replace` (--force); otherwise `fallback`, or, when it is
// taken (a file, a claim or a file being written is there), the first free
// of <stem>-2<ext>, <stem>-3<ext>, ..., which `note` then says. `problem` is
// output_file_problem's, or the refusal; "" when the path can be written.
struct ReportPath {
  std::string path, problem, note;
};
ReportPath choose_report_path(const std::string& named, const std::string& fallback, bool replace,
                              const std::string& what, const std::vector<Input>& inputs = {});

// Why the missing directories of `dir` cannot be made, or "": the nearest
// existing ancestor must be a writable directory.
std::string writable_place(const std::filesystem::path& dir);

}  // namespace strata::report
