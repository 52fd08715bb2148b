// The layout search behind `strata plan`: the layouts of a deck's model for
// N devices of a described machine, ranked by predicted throughput. The
// registry's rows say what may vary (Row::search: their keys, and the
// values their own constraints allow); every candidate is the deck with
// those overrides, judged by the deck's own checks and the conflicts table,
// its memory estimated and its step simulated (train::predict).
// Recomputation and offload only add work, so each layout takes the least
// of them that fits (the rows' `fit` searches, tried in order). The report
// (schema strata-plan v1) holds every candidate; strata-report ranks them
// and draws throughput against memory with its Pareto front.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::train {

struct SearchOptions {
  std::string machine;
  int world = 0;                  // devices to plan for
  std::uint64_t memory_limit = 0; // bytes per device; 0: the machine's
  int top = 10;                   // rows printed
  std::string output;             // default: results/<run.name>-plan.h5
  std::string command_line;
};

int search_layouts(const std::string& deck_path, const std::string& text, const std::vector<std::string>& sets,
                   const SearchOptions& o);

}  // namespace strata::train
