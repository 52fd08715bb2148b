// Whether a path may take a file this program writes (a report, a plan, a
// machine description), checked before any work so that a bad path is an
// input error (exit 2) and not a failure after minutes of it.
#pragma once

#include <filesystem>
#include <string>

namespace strata::report {

// Why `path` cannot be an output file, or "" when it can: it is a directory;
// it exists and is not a regular file (a device, a FIFO or a socket, which
// the write would replace or block on); its name ends in ".lock" or
// ".partial" (a run's claim on a path and a file being written: never
// outputs, and writing one would take another run's place); or its
// directory can neither be written nor made.
// `what` names the file in the directory case ("report": "give the
// report's file name").
std::string output_file_problem(const std::string& path, const std::string& what);

// Why the missing directories of `dir` cannot be made, or "": the nearest
// existing ancestor must be a writable directory.
std::string writable_place(const std::filesystem::path& dir);

}  // namespace strata::report
