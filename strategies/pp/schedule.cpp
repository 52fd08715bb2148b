#include "strategies/pp/schedule.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "kernels/foundation/error.hpp"
#include "plan/plan.hpp"

namespace strata::strategies::pp {

const char* op_name(Op op) {
  switch (op) {
    case Op::forward: return "forward";
    case Op::backward: return "backward";
    case Op::backward_input: return "backward_input";
    case Op::backward_weight: return "backward_weight";
    case Op::send_act: return "send_act";
    case Op::recv_act: return "recv_act";
    case Op::send_grad: return "send_grad";
    case Op::recv_grad: return "recv_grad";
    case Op::optimizer: return "optimizer";
  }
  return "?";
}

namespace {

Action F(int mb, int chunk = 0) { return {Op::forward, mb, chunk}; }
Action B(int mb, int chunk = 0) { return {Op::backward, mb, chunk}; }

}  // namespace

// All forwards, then all backwards (Huang et al., 2019): every micro-batch's
// activations are alive at once.
ComputeOrder gpipe(const Shape& s) {
  ComputeOrder order(s.p);
  for (int r = 0; r < s.p; ++r) {
    for (int mb = 0; mb < s.m; ++mb) order[r].push_back(F(mb));
    for (int mb = 0; mb < s.m; ++mb) order[r].push_back(B(mb));
  }
  return order;
}

// PipeDream-flush 1F1B (Narayanan et al., 2021): p - r - 1 warm-up forwards,
// then alternate one forward and one backward, then drain the backwards.
// Rank r never holds more than p - r micro-batches' activations.
ComputeOrder one_f_one_b(const Shape& s) {
  ComputeOrder order(s.p);
  for (int r = 0; r < s.p; ++r) {
    const int warmup = std::min(s.p - r - 1, s.m);
    for (int mb = 0; mb < warmup; ++mb) order[r].push_back(F(mb));
    for (int i = 0; i < s.m - warmup; ++i) {
      order[r].push_back(F(warmup + i));
      order[r].push_back(B(i));
    }
    for (int mb = s.m - warmup; mb < s.m; ++mb) order[r].push_back(B(mb));
  }
  return order;
}

// Interleaved 1F1B (Narayanan et al., 2021, Megatron-LM): the m x v
// (micro-batch, chunk) forwards of a rank run in groups of p micro-batches
// per chunk; backwards visit the chunks in reverse. Needs m % p == 0.
ComputeOrder interleaved_1f1b(const Shape& s) {
  ComputeOrder order(s.p);
  const int total = s.m * s.v;
  auto fwd = [&](int k) { return F((k / (s.p * s.v)) * s.p + k % s.p, (k / s.p) % s.v); };
  auto bwd = [&](int k) { return B((k / (s.p * s.v)) * s.p + k % s.p, s.v - 1 - (k / s.p) % s.v); };
  for (int r = 0; r < s.p; ++r) {
    const int warmup = s.m == s.p ? total : std::min(total, (s.p - r - 1) * 2 + (s.v - 1) * s.p);
    for (int k = 0; k < warmup; ++k) order[r].push_back(fwd(k));
    for (int i = 0; i < total - warmup; ++i) {
      order[r].push_back(fwd(warmup + i));
      order[r].push_back(bwd(i));
    }
    for (int k = total - warmup; k < total; ++k) order[r].push_back(bwd(k));
  }
  return order;
}

// ZB-H1 (Qi et al., 2023): 1F1B with each backward split into its
// input-gradient half B (on the critical path: the previous stage waits for
// it) and its weight-gradient half W (which nobody waits for). Same warm-up
// as 1F1B; rank r postpones its W passes by r micro-batches, so that every
// rank holds the same p micro-batches between F and W (the first rank's
// 1F1B peak, so the peak memory is 1F1B's), the backward wave runs through
// the later stages at B speed, and the postponed W passes fill the drain.
// With unit costs (F = B = W) its bubble is (p-1)/(3m+p-1), a third of 1F1B's.
ComputeOrder zb_h1(const Shape& s) {
  ComputeOrder order(s.p);
  for (int r = 0; r < s.p; ++r) {
    const int warmup = std::min(s.p - r - 1, s.m);
    int next_w = 0;
    auto weight_until = [&](int last) {
      for (; next_w <= last; ++next_w) order[r].push_back({Op::backward_weight, next_w, 0});
    };
    for (int mb = 0; mb < warmup; ++mb) order[r].push_back(F(mb));
    for (int i = 0; i < s.m; ++i) {
      if (warmup + i < s.m) order[r].push_back(F(warmup + i));
      order[r].push_back({Op::backward_input, i, 0});
      weight_until(i - r);
    }
    weight_until(s.m - 1);
  }
  return order;
}

const Placement kInterleaved = {
    "interleaved", [](const Shape& s, int rank, int chunk) { return chunk * s.p + rank; },
    [](const Shape& s, int stage) { return stage % s.p; }};

Schedule add_communication(const ComputeOrder& order, const Shape& s, const Placement& placement) {
  const int stages = s.p * s.v;
  auto stage_rank = [&](const Shape& shape, int stage) { return placement.rank_of(shape, stage); };
  Schedule out(order.size());
  for (int r = 0; r < int(order.size()); ++r) {
    for (const Action& a : order[r]) {
      const int st = placement.stage_of(s, r, a.chunk);
      const bool first = st == 0, last = st == stages - 1;
      switch (a.op) {
        case Op::forward:
          if (!first) out[r].push_back({Op::recv_act, a.mb, a.chunk, stage_rank(s, st - 1)});
          out[r].push_back(a);
          if (!last) out[r].push_back({Op::send_act, a.mb, a.chunk, stage_rank(s, st + 1)});
          break;
        case Op::backward:
        case Op::backward_input:
          if (!last) out[r].push_back({Op::recv_grad, a.mb, a.chunk, stage_rank(s, st + 1)});
          out[r].push_back(a);
          if (!first) out[r].push_back({Op::send_grad, a.mb, a.chunk, stage_rank(s, st - 1)});
          break;
        default:
          out[r].push_back(a);
      }
    }
    out[r].push_back({Op::optimizer});
  }
  return out;
}

namespace {

// Shape problems are said in the deck's terms: m is global_batch / (dp x
// micro_batch), v parallel.virtual_stages.
std::string at_least_p(const Shape& s) {
  if (s.m < s.p)
    return fmt::format("needs at least as many micro-batches per step as pipeline stages: global_batch / (dp x "
                       "micro_batch) = {} < parallel.pp = {}",
                       s.m, s.p);
  return "";
}

std::string interleaved_shape(const Shape& s) {
  if (s.p < 2 || s.v < 2)
    return fmt::format("needs pp >= 2 and >= 2 model chunks per pipeline rank (parallel.pp = {}, "
                       "parallel.virtual_stages = {}; 1 is the plain 1f1b schedule)",
                       s.p, s.v);
  if (const std::string m = at_least_p(s); !m.empty()) return m;
  if (s.m % s.p != 0)
    return fmt::format("runs micro-batches in groups of pp (a multiple of pp): global_batch / (dp x micro_batch) = "
                       "{} is not a multiple of parallel.pp = {}",
                       s.m, s.p);
  return "";
}

}  // namespace

const std::vector<ScheduleInfo>& schedules() {
  static const std::vector<ScheduleInfo> all = {
      {"1f1b", one_f_one_b, [](const Shape& s) { return double(s.p - 1) / (s.m + s.p - 1); }, "(p-1)/(m+p-1)",
       false, &kInterleaved, at_least_p, false, "p - rank micro-batches' activations"},
      {"gpipe", gpipe, [](const Shape& s) { return double(s.p - 1) / (s.m + s.p - 1); }, "(p-1)/(m+p-1)", false,
       &kInterleaved, nullptr, false, "every micro-batch's activations until the backward passes: m on every rank"},
      {"interleaved", interleaved_1f1b, [](const Shape& s) { return double(s.p - 1) / (s.v * s.m + s.p - 1); },
       "(p-1)/(v m+p-1)", true, &kInterleaved, interleaved_shape, false,
       "per chunk, the pairs its liveness counts (the first rank's first chunk the most)"},
      {"zb-h1", zb_h1, [](const Shape& s) { return double(s.p - 1) / (3 * s.m + s.p - 1); }, "(p-1)/(3m+p-1)",
       false, &kInterleaved, at_least_p, true,
       "p micro-batches' activations on every rank (weight halves postponed to the first rank's 1F1B depth)"},
      {"zb-v", zb_v, zb_v_bubble, "1 - 6m/T, T its unit-cost makespan (list-scheduled)", true, &kV, zb_v_shape,
       true, "at most 2p chunks' activations per rank from F to W: 1F1B's first-rank peak"},
  };
  return all;
}

const ScheduleInfo& find_schedule(const std::string& name) {
  for (const auto& s : schedules())
    if (name == s.name) return s;
  core::runtime_error("unknown pipeline schedule '{}'", name);
}

std::string check_shape(const ScheduleInfo& row, const Shape& s) {
  if (s.p < 1 || s.m < 1 || s.v < 1) return fmt::format("p {}, m {} and v {} must be >= 1", s.p, s.m, s.v);
  if (!row.virtual_stages && s.v != 1)
    return fmt::format("the {} schedule has one model chunk per rank: virtual_stages must be 1, not {}", row.name, s.v);
  if (row.shape_problem == nullptr) return "";
  const std::string why = row.shape_problem(s);
  return why.empty() ? "" : fmt::format("the {} schedule {}", row.name, why);
}

Schedule make_schedule(const ScheduleInfo& row, const Shape& s) {
  const std::string problem = check_shape(row, s);
  STRATA_CHECK(problem.empty(), "{}", problem);
  return add_communication(row.generate(s), s, *row.placement);
}

}  // namespace strata::strategies::pp
