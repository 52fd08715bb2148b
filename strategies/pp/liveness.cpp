#include "strategies/pp/liveness.hpp"

#include <algorithm>
#include <map>
#include <utility>

namespace strata::strategies::pp {

Liveness liveness(const std::vector<Action>& actions) {
  Liveness l;
  int chunks = 1;
  for (const Action& a : actions) chunks = std::max(chunks, a.chunk + 1);
  const std::size_t n = actions.size();
  l.first_of_pair.assign(n, 0);
  l.last_of_pair.assign(n, 0);
  l.completes_chunk.assign(n, 0);
  l.slots.assign(std::size_t(chunks), 0);
  std::map<std::pair<int, int>, std::pair<std::size_t, std::size_t>> span;  // (chunk, mb) -> first, last action
  std::vector<int> chunk_last(std::size_t(chunks), -1);
  for (std::size_t i = 0; i < n; ++i) {
    const Action& a = actions[i];
    if (a.op == Op::backward_input) l.split_backward = true;
    if (a.op == Op::backward || a.op == Op::backward_weight) chunk_last[std::size_t(a.chunk)] = int(i);
    if (a.mb < 0) continue;
    auto [it, fresh] = span.try_emplace({a.chunk, a.mb}, i, i);
    if (!fresh) it->second.second = i;
  }
  for (int i : chunk_last)
    if (i >= 0) l.completes_chunk[std::size_t(i)] = 1;
  for (const auto& [pair, fl] : span) {
    l.first_of_pair[fl.first] = 1;
    l.last_of_pair[fl.second] = 1;
  }
  // Sweep the actions: a pair counts from its first action to its last.
  std::vector<int> live(std::size_t(chunks), 0);
  int total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const Action& a = actions[i];
    const auto c = std::size_t(a.chunk);
    if (l.first_of_pair[i]) {
      l.slots[c] = std::max(l.slots[c], ++live[c]);
      l.most_live = std::max(l.most_live, ++total);
    }
    if (l.last_of_pair[i]) --live[c], --total;
  }
  return l;
}

}  // namespace strata::strategies::pp
