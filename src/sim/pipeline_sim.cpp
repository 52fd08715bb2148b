#include "src/sim/pipeline_sim.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

namespace strata::sim {

using strategies::pp::Action;
using strategies::pp::Op;

PipelineRun simulate(const strategies::pp::Schedule& sched, const UnitCosts& costs, bool bounded_slots) {
  const int p = int(sched.size());
  PipelineRun run;
  run.ranks.resize(p);
  std::vector<std::size_t> next(p, 0);
  std::vector<double> clock(p, 0.0);
  std::vector<int> in_flight(p, 0);
  // (src, dst, is_grad) -> times of the sends so far, and receives consumed.
  using Key = std::tuple<int, int, bool>;
  std::map<Key, std::vector<double>> sends;
  std::map<Key, std::size_t> consumed;
  // bounded_slots: receives posted per key (run, or waiting for their send).
  // A send is received, so its buffer free, once its receive is posted.
  std::map<Key, std::size_t> posted;
  // bounded_slots: per rank, its liveness, the free stage models per chunk,
  // the sends of each pair (by (chunk, mb)), the pairs whose last action ran
  // but whose sends may not have been received yet, the pairs started, and
  // the receives posted.
  struct Slots {
    strategies::pp::Liveness live;
    std::vector<int> free;
    std::map<std::pair<int, int>, std::vector<std::pair<Key, std::size_t>>> sent;
    std::vector<std::pair<int, int>> draining;
    std::set<std::pair<int, int>> started;
    std::set<std::size_t> posted;
  };
  std::vector<Slots> slots(std::size_t(bounded_slots ? p : 0));
  for (int r = 0; r < int(slots.size()); ++r) {
    slots[r].live = strategies::pp::liveness(sched[r]);
    slots[r].free = slots[r].live.slots;
  }
  // A model of `chunk` on rank r free now, or after a draining pair of that
  // chunk whose sends have all been received gives its own back.
  auto take = [&](int r, int chunk) {
    Slots& s = slots[r];
    for (std::size_t i = 0; s.free[chunk] == 0 && i < s.draining.size();) {
      const auto pair = s.draining[i];
      bool received = true;
      for (const auto& [key, index] : s.sent[pair]) received = received && posted[key] > index;
      if (received) {
        ++s.free[pair.first];
        s.sent.erase(pair);
        s.draining.erase(s.draining.begin() + std::ptrdiff_t(i));
      } else {
        ++i;
      }
    }
    if (s.free[chunk] == 0) return false;
    --s.free[chunk];
    return true;
  };

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
        if (bounded_slots && slots[r].live.first_of_pair[next[r]] && !slots[r].started.count({a.chunk, a.mb})) {
          if (!take(r, a.chunk)) break;
          slots[r].started.insert({a.chunk, a.mb});
        }
        if (a.op == Op::recv_act || a.op == Op::recv_grad) {
          const auto key = std::make_tuple(a.peer, r, a.op == Op::recv_grad);
          const auto& q = sends[key];
          std::size_t& k = consumed[key];
          // A receive waiting for its send has been posted (it lets a
          // bounded sender's send complete).
          if (bounded_slots && slots[r].posted.insert(next[r]).second) ++posted[key];
          if (k >= q.size()) break;  // its send has not happened yet
          clock[r] = std::max(clock[r], q[k++]);
        } else if (a.op == Op::send_act || a.op == Op::send_grad) {
          auto& q = sends[{r, a.peer, a.op == Op::send_grad}];
          if (bounded_slots) slots[r].sent[{a.chunk, a.mb}].push_back({{r, a.peer, a.op == Op::send_grad}, q.size()});
          q.push_back(clock[r]);
        } else {
          const double c = cost(a.op);
          clock[r] += c;
          if (a.op != Op::optimizer) run.ranks[r].busy += c;
          if (a.op == Op::forward) run.ranks[r].max_in_flight = std::max(run.ranks[r].max_in_flight, ++in_flight[r]);
          if (a.op == Op::backward || a.op == Op::backward_input) --in_flight[r];
        }
        if (bounded_slots && slots[r].live.last_of_pair[next[r]]) slots[r].draining.push_back({a.chunk, a.mb});
        ++next[r];
        moved = true;
      }
    }
  }
  for (int r = 0; r < p; ++r) {
    run.ranks[r].max_alive = strategies::pp::liveness(sched[r]).most_live;
    run.ranks[r].end = clock[r];
    run.makespan = std::max(run.makespan, clock[r]);
    if (next[r] < sched[r].size()) {
      const Action& a = sched[r][next[r]];
      const bool for_slot =
          bounded_slots && slots[r].live.first_of_pair[next[r]] && !slots[r].started.count({a.chunk, a.mb});
      run.deadlock += fmt::format("{}rank {} waits in {} of micro-batch {} chunk {} {}", run.deadlock.empty() ? "" : "; ",
                                  r, strategies::pp::op_name(a.op), a.mb, a.chunk,
                                  for_slot ? std::string("for a free stage model") : fmt::format("from rank {}", a.peer));
    }
  }
  return run;
}

}  // namespace strata::sim
