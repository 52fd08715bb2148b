// What `strata run` is asked for beyond the deck: where the report and the
// checkpoints go, whether to resume, dry-run or replace. Its own header so
// that the session and the dry run, which run_deck calls, need not include
// run.hpp.
#pragma once

#include <string>

namespace strata::train {

struct RunOptions {
  std::string output;        // overrides run.output when not empty
  bool dry_run = false;      // validate and print the plan; write nothing
  std::string command_line;
  int checkpoint_every = 0;  // write a checkpoint after every N steps (0: never)
  std::string checkpoint_dir;  // default: checkpoints/<run.name>
  std::string resume;        // a checkpoint (or a directory of them) to continue from
  bool force = false;        // replace a file at the report path named
};

}  // namespace strata::train
