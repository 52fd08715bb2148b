#include "strategies/pp/schedule.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "kernels/foundation/error.hpp"

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

Schedule add_communication(const ComputeOrder& order, const Shape& s) {
  const int stages = s.p * s.v;
  Schedule out(order.size());
  for (int r = 0; r < int(order.size()); ++r) {
    for (const Action& a : order[r]) {
      const int st = global_stage(s, r, a.chunk);
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

const std::vector<ScheduleInfo>& schedules() {
  static const std::vector<ScheduleInfo> all = {
      {"gpipe", gpipe, [](const Shape& s) { return double(s.p - 1) / (s.m + s.p - 1); }, "(p-1)/(m+p-1)", false},
      {"1f1b", one_f_one_b, [](const Shape& s) { return double(s.p - 1) / (s.m + s.p - 1); }, "(p-1)/(m+p-1)",
       false},
      {"interleaved", interleaved_1f1b, [](const Shape& s) { return double(s.p - 1) / (s.v * s.m + s.p - 1); },
       "(p-1)/(v m+p-1)", true},
      {"zb-h1", zb_h1, [](const Shape& s) { return double(s.p - 1) / (3 * s.m + s.p - 1); }, "(p-1)/(3m+p-1)",
       false},
  };
  return all;
}

const ScheduleInfo& find_schedule(const std::string& name) {
  for (const auto& s : schedules())
    if (name == s.name) return s;
  core::runtime_error("unknown pipeline schedule '{}'", name);
}

std::string check_shape(const std::string& name, const Shape& s) {
  const ScheduleInfo& info = find_schedule(name);
  if (s.p < 1 || s.m < 1 || s.v < 1) return fmt::format("p {}, m {} and v {} must be >= 1", s.p, s.m, s.v);
  if (!info.virtual_stages && s.v != 1)
    return fmt::format("the {} schedule has one model chunk per rank: virtual_stages must be 1, not {}", name, s.v);
  if (name == "gpipe") return "";
  if (info.virtual_stages && (s.p < 2 || s.v < 2))
    return fmt::format("the interleaved schedule needs pp >= 2 and virtual_stages >= 2 (pp {}, virtual_stages {})",
                       s.p, s.v);
  if (s.m < s.p)
    return fmt::format("the {} schedule needs at least as many micro-batches as pipeline stages: {} < pp {}", name,
                       s.m, s.p);
  if (info.virtual_stages && s.m % s.p != 0)
    return fmt::format("the interleaved schedule needs micro-batches a multiple of pp: {} % {} != 0", s.m, s.p);
  return "";
}

Schedule make_schedule(const std::string& name, const Shape& s) {
  const std::string problem = check_shape(name, s);
  STRATA_CHECK(problem.empty(), "{}", problem);
  return add_communication(find_schedule(name).generate(s), s);
}

}  // namespace strata::strategies::pp
