// An exclusive claim on a path: the file "<path>.lock", created with
// O_EXCL, holding "host pid". A run claims its report and checkpoint
// directory (src/train/paths.hpp, on rank 0 for every rank), a sweep driver
// its results directory, so that two never write the same files. A claim of
// a process of this host that no longer runs is stale and taken over.
#pragma once

#include <string>

namespace strata::report {

// Takes the claim `lock` on `path` for this process: "" when taken (its
// text in *content; *said a line to print when a stale claim was taken
// over), else why not, naming the holder. `what` names the path ("report").
std::string take_claim(const std::string& path, const std::string& lock, const char* what, std::string* content,
                       std::string* said);
// Removes `lock` if it still holds `content` (after a stale takeover by
// another process, the file is theirs).
void release_claim(const std::string& lock, const std::string& content);

}  // namespace strata::report
