#include "strategies/pp/liveness.hpp"

#include <algorithm>
#include <vector>
#include <utility>

namespace strata::strategies::pp {

Liveness liveness(const std::vector<Action>& actions) {
  Liveness l;
  int chunks = 1, mbs = 0;
  for (const Action& a : actions) chunks = std::max(chunks, a.chunk + 1), mbs = std::max(mbs, a.mb + 1);
  const std::size_t n = actions.size();
  l.first_of_pair.assign(n, 0);
  l.last_of_pair.assign(n, 0);
  l.completes_chunk.assign(n, 0);
  l.slots.assign(std::size_t(chunks), 0);
  // (chunk, mb) -> its first and last action (kNone: none), flat: this runs
  // for every schedule the planner's bound simulates.
  constexpr std::size_t kNone = ~std::size_t(0);
  std::vector<std::pair<std::size_t, std::size_t>> span(std::size_t(chunks) * std::size_t(mbs), {kNone, kNone});
  std::vector<int> chunk_last(std::size_t(chunks), -1);
  for (std::size_t i = 0; i < n; ++i) {
    const Action& a = actions[i];
    if (a.op == Op::backward_input) l.split_backward = true;
    if (a.op == Op::backward || a.op == Op::backward_weight) chunk_last[std::size_t(a.chunk)] = int(i);
    if (a.mb < 0) continue;
    auto& s = span[std::size_t(a.chunk) * std::size_t(mbs) + std::size_t(a.mb)];
    if (s.first == kNone) s.first = i;
    s.second = i;
  }
  for (int i : chunk_last)
    if (i >= 0) l.completes_chunk[std::size_t(i)] = 1;
  for (const auto& [first, last] : span) {
    if (first == kNone) continue;
    l.first_of_pair[first] = 1;
    l.last_of_pair[last] = 1;
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
