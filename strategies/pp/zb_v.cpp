// ZB-V (Qi et al., "Pipeline Parallelism with Controllable Memory", 2024,
// the V-shape follow-up of "Zero Bubble Pipeline Parallelism", ICLR 2024):
// two model chunks per rank placed as a V, rank r holding stages r and
// 2p - 1 - r, so a micro-batch's forward runs down the ranks and back up and
// its backward the other way; the first and the last stage share rank 0.
// Backward passes are split into the input half B (which the previous stage
// waits for) and the weight half W (which nobody waits for), as in ZB-H1.
//
// The order is list-scheduled at unit costs per chunk (F = B = W = 1): at
// every tick each idle rank takes, in this order,
//   1. a ready B, oldest micro-batch first (the backward is the critical
//      path), the later stage first on a tie;
//   2. a ready F, oldest micro-batch first and the second chunk first, while
//      the rank holds fewer than 2p chunks' activations (F to W), 1F1B's
//      peak: p micro-batches of a whole stage; a first-chunk F leaves one
//      place free, which the rank's second chunk needs to carry its oldest
//      micro-batch on (without it a full rank could wait for itself);
//   3. its oldest pending W;
// else it idles until another rank's pass makes something ready. Every pass
// costs the same, so the ticks are the timeline, and the unit-cost simulator
// replays the lists to the same makespan: the bubble is 1 - 6m / makespan.
#include <algorithm>
#include <deque>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "kernels/foundation/error.hpp"
#include "strategies/pp/schedule.hpp"

namespace strata::strategies::pp {

const Placement kV = {
    "v", [](const Shape& s, int rank, int chunk) { return chunk == 0 ? rank : 2 * s.p - 1 - rank; },
    [](const Shape& s, int stage) { return stage < s.p ? stage : 2 * s.p - 1 - stage; }};

namespace {

// The compute order and its makespan in ticks.
struct Listed {
  ComputeOrder order;
  int makespan = 0;
};

Listed list_schedule(const Shape& s) {
  STRATA_CHECK(s.v == 2, "zb-v holds two chunks per rank, not {}", s.v);
  const int p = s.p, m = s.m, stages = 2 * p, limit = 2 * p;
  constexpr int kNever = std::numeric_limits<int>::max();
  // When (micro-batch, stage)'s F and B finished; kNever until then.
  std::vector<std::vector<int>> f_done(std::size_t(m), std::vector<int>(std::size_t(stages), kNever));
  auto b_done = f_done;
  struct Rank {
    int next_f[2] = {0, 0}, next_b[2] = {0, 0};  // per chunk, the next micro-batch
    int held = 0;                                 // chunks' activations from F to W
    std::deque<std::pair<int, int>> pending_w;   // (micro-batch, chunk), in B order
    std::vector<int> w_ends;                      // ticks its W passes end at, each freeing a place
  };
  std::vector<Rank> ranks(static_cast<std::size_t>(p));
  Listed out;
  out.order.resize(std::size_t(p));
  const int total = 6 * m * p;  // passes
  int done = 0;
  for (int t = 0; done < total; ++t) {
    STRATA_CHECK(t < 8 * (m + p) * 6, "zb-v list scheduling made no progress (p {}, m {})", p, m);
    for (int r = 0; r < p; ++r) {
      Rank& k = ranks[std::size_t(r)];
      // Places freed by weight halves that ended by now.
      k.held -= int(std::count_if(k.w_ends.begin(), k.w_ends.end(), [&](int end) { return end <= t; }));
      std::erase_if(k.w_ends, [&](int end) { return end <= t; });
    }
    // Every pass takes one tick, so each rank is free to start one now. The
    // passes started this tick end at t + 1: none is ready for another rank
    // before the next tick, whatever order the ranks are visited in.
    for (int r = 0; r < p; ++r) {
      Rank& k = ranks[std::size_t(r)];
      auto stage = [&](int chunk) { return kV.stage_of(s, r, chunk); };
      Action pick{Op::optimizer};
      // 1. B, oldest micro-batch first, the later stage (chunk 1) on a tie.
      int best_mb = kNever;
      for (int c : {1, 0}) {
        const int mb = k.next_b[c], st = stage(c);
        if (mb >= m || f_done[std::size_t(mb)][std::size_t(st)] > t) continue;
        if (st + 1 < stages && b_done[std::size_t(mb)][std::size_t(st + 1)] > t) continue;
        if (mb < best_mb) best_mb = mb, pick = {Op::backward_input, mb, c};
      }
      // 2. F, oldest micro-batch first, chunk 1 on a tie, within the limit.
      if (pick.op == Op::optimizer) {
        for (int c : {1, 0}) {
          const int mb = k.next_f[c], st = stage(c);
          if (mb >= m || k.held >= limit - (c == 0 ? 1 : 0)) continue;
          if (st > 0 && f_done[std::size_t(mb)][std::size_t(st - 1)] > t) continue;
          if (pick.op == Op::optimizer || mb < pick.mb) pick = {Op::forward, mb, c};
        }
      }
      // 3. The oldest pending W.
      if (pick.op == Op::optimizer && !k.pending_w.empty()) {
        pick = {Op::backward_weight, k.pending_w.front().first, k.pending_w.front().second};
        k.pending_w.pop_front();
      }
      if (pick.op == Op::optimizer) continue;  // idle this tick
      const int st = stage(pick.chunk);
      switch (pick.op) {
        case Op::forward:
          f_done[std::size_t(pick.mb)][std::size_t(st)] = t + 1;
          ++k.next_f[pick.chunk];
          ++k.held;
          break;
        case Op::backward_input:
          b_done[std::size_t(pick.mb)][std::size_t(st)] = t + 1;
          ++k.next_b[pick.chunk];
          k.pending_w.emplace_back(pick.mb, pick.chunk);
          break;
        default:
          k.w_ends.push_back(t + 1);
      }
      out.order[std::size_t(r)].push_back(pick);
      out.makespan = std::max(out.makespan, t + 1);
      ++done;
    }
  }
  return out;
}

}  // namespace

ComputeOrder zb_v(const Shape& s) { return list_schedule(s).order; }

double zb_v_bubble(const Shape& s) { return 1.0 - 6.0 * s.m / list_schedule(s).makespan; }

std::string zb_v_shape(const Shape& s) {
  if (s.v != 2)
    return fmt::format("holds two model chunks per pipeline rank, placed as a V: parallel.virtual_stages must be 2, "
                       "not {}",
                       s.v);
  return "";
}

}  // namespace strata::strategies::pp
