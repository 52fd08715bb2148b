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

namespace strata::plan {
struct Plan;
}
namespace strata::sim {
struct Machine;
}

namespace strata::train {

struct SearchOptions {
  std::string machine;
  int world = 0;                  // devices to plan for
  std::uint64_t memory_limit = 0; // bytes per device; 0: the machine's
  int top = 10;                   // rows printed
  int jobs = 0;                   // processes judging layouts; 0: one per core
  std::string output;             // default: results/<run.name>-plan.h5
  std::string command_line;
  bool exhaustive = false;        // judge every layout, none pruned by its bound
  bool force = false;             // replace a file at --output
};

// A candidate's predicted figures. A step of m micro-batches per rank costs
// what its first ones cost plus the same for each further one (a pipeline's
// steady state adds one period per micro-batch, or per group of pp under
// the interleaved schedules; in-flight activations are constant or grow by
// the same bytes each), so a layout with many micro-batches is simulated at
// two small counts, m1 and m1 + k, and its step time, peak memory, idle and
// exposed communication extended along that line to m (micro_batch_line,
// src/train/bound.hpp). A layout with few micro-batches is simulated whole
// (simulated == micro_batches).
struct Figures {
  double step_time = 0, tokens_per_s = 0, mfu = 0, peak_bytes = 0, bubble = 0, exposed_comm = 0;
  int micro_batches = 0;  // per rank and step, as the deck has them
  int simulated = 0;      // the most simulated
};
Figures plan_figures(const plan::Plan& cfg, const sim::Machine& machine);

int search_layouts(const std::string& deck_path, const std::string& text, const std::vector<std::string>& sets,
                   const SearchOptions& o);

}  // namespace strata::train
