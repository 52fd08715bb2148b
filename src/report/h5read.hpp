// Reading back what a report says about itself: its status and headline
// figures. The sweep driver uses it to resume (a point whose report is
// complete is done) and to build its index. Serial HDF5 access: no MPI.
#pragma once

#include <optional>
#include <string>

namespace strata::report {

struct Headline {
  std::string status;          // "complete", "failed", "running" (a report left mid-run)
  std::string error;           // the failed run's message, if any
  double tokens_per_s = 0;     // /summary scalars; 0 where absent
  double mfu = 0;
  double step_time = 0;
  double final_loss = 0;
  double peak_bytes_total = 0;
};

// nullopt when no readable report is at `path`: none there, not HDF5, or
// one HDF5 fails on (read in a child process, whose death is that answer).
std::optional<Headline> read_headline(const std::string& path);

}  // namespace strata::report
