// `strata plan`: the layouts of a deck's model for N devices of a described
// machine, ranked by predicted throughput. Every candidate is the deck with
// overrides (dp, tp, pp, ep, ZeRO stage, schedule and virtual stages,
// micro-batch, sequence parallelism, recomputation, offload), validated by
// the deck's own checks, its memory estimated and its step simulated
// (train::predict). Recomputation and offload only add work, so each layout
// takes the least of them that fits: none, then selective, then full
// recomputation, then each again with optimizer offload to the host.
// The report (schema strata-plan v1) holds every candidate; strata-report
// ranks them and draws throughput against memory with its Pareto front.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::train {

struct PlanOptions {
  std::string machine;
  int world = 0;                  // devices to plan for
  std::uint64_t memory_limit = 0; // bytes per device; 0: the machine's
  int top = 10;                   // rows printed
  std::string output;             // default: results/<run.name>-plan.h5
  std::string command_line;
};

int plan_deck(const std::string& deck_path, const std::string& text, const std::vector<std::string>& sets,
              const PlanOptions& o);

}  // namespace strata::train
