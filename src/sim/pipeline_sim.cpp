#include "src/sim/pipeline_sim.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include <fmt/format.h>

namespace strata::sim {

using strategies::pp::Action;
using strategies::pp::Op;

PipelineRun simulate(const strategies::pp::Schedule& sched, const UnitCosts& costs) {
  const int p = int(sched.size());
  PipelineRun run;
  run.ranks.resize(p);
  std::vector<std::size_t> next(p, 0);
  std::vector<double> clock(p, 0.0);
  std::vector<int> in_flight(p, 0), alive(p, 0);
  // (src, dst, is_grad) -> times of the sends so far, and receives consumed.
  std::map<std::tuple<int, int, bool>, std::vector<double>> sends;
  std::map<std::tuple<int, int, bool>, std::size_t> consumed;

  auto cost = [&](Op op) {
    switch (op) {
      case Op::forward: return costs.forward;
      case Op::backward: return costs.backward;
      case Op::backward_input: return costs.backward_input;
      case Op::backward_weight: return costs.backward_weight;
      case Op::optimizer: return costs.optimizer;
      default: return 0.0;
    }
  };

  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      while (next[r] < sched[r].size()) {
        const Action& a = sched[r][next[r]];
        if (a.op == Op::recv_act || a.op == Op::recv_grad) {
          const auto key = std::make_tuple(a.peer, r, a.op == Op::recv_grad);
          const auto& q = sends[key];
          std::size_t& k = consumed[key];
          if (k >= q.size()) break;  // its send has not happened yet
          clock[r] = std::max(clock[r], q[k++]);
        } else if (a.op == Op::send_act || a.op == Op::send_grad) {
          sends[{r, a.peer, a.op == Op::send_grad}].push_back(clock[r]);
        } else {
          const double c = cost(a.op);
          clock[r] += c;
          if (a.op != Op::optimizer) run.ranks[r].busy += c;
          if (a.op == Op::forward) {
            run.ranks[r].max_in_flight = std::max(run.ranks[r].max_in_flight, ++in_flight[r]);
            run.ranks[r].max_alive = std::max(run.ranks[r].max_alive, ++alive[r]);
          }
          if (a.op == Op::backward || a.op == Op::backward_input) --in_flight[r];
          if (a.op == Op::backward || a.op == Op::backward_weight) --alive[r];
        }
        ++next[r];
        moved = true;
      }
    }
  }
  for (int r = 0; r < p; ++r) {
    run.ranks[r].end = clock[r];
    run.makespan = std::max(run.makespan, clock[r]);
    if (next[r] < sched[r].size()) {
      const Action& a = sched[r][next[r]];
      run.deadlock += fmt::format("{}rank {} waits in {} of micro-batch {} chunk {} from rank {}",
                                  run.deadlock.empty() ? "" : "; ", r, strategies::pp::op_name(a.op), a.mb, a.chunk,
                                  a.peer);
    }
  }
  return run;
}

}  // namespace strata::sim
