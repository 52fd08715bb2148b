#include "strategies/pp/check.hpp"

#include <array>
#include <map>
#include <tuple>
#include <vector>

#include <fmt/format.h>

namespace strata::strategies::pp {

std::string check_schedule(const Schedule& sched, const Shape& s, const Placement& placement) {
  if (int(sched.size()) != s.p) return fmt::format("{} rank lists for p = {}", sched.size(), s.p);
  // (src, dst, is_grad) -> the (mb, chunk) sequence sent and received.
  std::map<std::tuple<int, int, bool>, std::vector<std::pair<int, int>>> sent, received;
  for (int r = 0; r < s.p; ++r) {
    const auto& list = sched[r];
    if (list.empty() || list.back().op != Op::optimizer) return fmt::format("rank {}: does not end with the optimizer", r);
    // Index of each compute action per (mb, chunk); -1 if absent.
    std::map<std::pair<int, int>, std::array<int, 4>> at;
    for (int i = 0; i < int(list.size()); ++i) {
      const Action& a = list[i];
      const int kind = a.op == Op::forward ? 0 : a.op == Op::backward ? 1 : a.op == Op::backward_input ? 2
                       : a.op == Op::backward_weight ? 3 : -1;
      if (kind >= 0) {
        auto [it, fresh] = at.try_emplace({a.mb, a.chunk}, std::array<int, 4>{-1, -1, -1, -1});
        if (it->second[kind] >= 0)
          return fmt::format("rank {}: {} of micro-batch {} chunk {} appears twice", r, op_name(a.op), a.mb, a.chunk);
        it->second[kind] = i;
      }
      // Transfers are named by (micro-batch, producing global stage), which
      // both ends agree on whatever their own chunk numbers are.
      const int st = placement.stage_of(s, r, a.chunk);
      if (a.op == Op::send_act || a.op == Op::send_grad) sent[{r, a.peer, a.op == Op::send_grad}].push_back({a.mb, st});
      if (a.op == Op::recv_act) received[{a.peer, r, false}].push_back({a.mb, st - 1});
      if (a.op == Op::recv_grad) received[{a.peer, r, true}].push_back({a.mb, st + 1});
    }
    for (int c = 0; c < s.v; ++c)
      for (int mb = 0; mb < s.m; ++mb) {
        auto it = at.find({mb, c});
        if (it == at.end()) return fmt::format("rank {}: micro-batch {} chunk {} never runs", r, mb, c);
        const auto& k = it->second;
        const bool whole = k[1] >= 0 && k[2] < 0 && k[3] < 0, split = k[1] < 0 && k[2] >= 0 && k[3] >= 0;
        if (k[0] < 0 || !(whole || split))
          return fmt::format("rank {}: micro-batch {} chunk {} needs one forward and one backward "
                             "(or backward_input and backward_weight)", r, mb, c);
        const int b = whole ? k[1] : k[2];
        if (b < k[0]) return fmt::format("rank {}: micro-batch {} chunk {}: backward before forward", r, mb, c);
        if (split && k[3] < k[2])
          return fmt::format("rank {}: micro-batch {} chunk {}: backward_weight before backward_input", r, mb, c);
      }
    if (int(at.size()) != s.m * s.v) return fmt::format("rank {}: compute for a chunk it does not hold", r);
  }
  for (const auto& [key, seq] : sent) {
    const auto& [src, dst, grad] = key;
    if (received[key] != seq)
      return fmt::format("{} from rank {} to rank {}: the receives do not match the sends in order",
                         grad ? "gradients" : "activations", src, dst);
  }
  for (const auto& [key, seq] : received)
    if (!sent.count(key) && !seq.empty())
      return fmt::format("rank {} receives from rank {} what is never sent", std::get<1>(key), std::get<0>(key));
  return "";
}

}  // namespace strata::strategies::pp
