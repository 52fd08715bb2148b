#include "strategies/pp/executor.hpp"

#include "kernels/foundation/error.hpp"

namespace strata::strategies::pp {

Executor::Executor(const ScheduleInfo& row, const Shape& shape, int rank, comm::Communicator& pp, const MakeModel& make)
    : shape_(shape), pp_(pp) {
  actions_ = make_schedule(row, shape)[std::size_t(rank)];
  live_ = liveness(actions_);
  chunks_.resize(std::size_t(shape.v));
  for (int c = 0; c < shape.v; ++c) {
    Chunk& ch = chunks_[std::size_t(c)];
    const int stage = row.placement->stage_of(shape, rank, c);
    for (int k = 0; k < std::max(live_.slots[std::size_t(c)], 1); ++k) {
      ch.slots.push_back(make(stage, live_.split_backward));
      ch.free.push_back(ch.slots.back().get());
    }
    ch.of_mb.assign(std::size_t(shape.m), nullptr);
  }
}

std::size_t Executor::stage_models() const {
  std::size_t n = 0;
  for (const auto& ch : chunks_) n += ch.slots.size();
  return n;
}

void Executor::lay_out(models::ParamRegistry& reg, std::vector<models::Unit>& units) {
  for (Chunk& ch : chunks_) {
    const models::Model& m = *ch.slots[0];
    const std::int64_t base = reg.numel();
    ch.first_unit = int(units.size());
    reg.append(m.registry());
    for (const auto& u : m.units()) units.push_back({base + u.begin, base + u.end});
  }
}

void Executor::use_state(StateStrategy& strategy) {
  strategy_ = &strategy;
  if (chunks_.size() > 1)
    for (Chunk& ch : chunks_)
      ch.view = std::make_unique<models::ShiftedState>(strategy.state(), ch.first_unit,
                                                       int(ch.slots[0]->units().size()));
}

models::ParamState& Executor::state_of(int chunk) {
  auto& view = chunks_[std::size_t(chunk)].view;
  return view ? *view : strategy_->state();
}

double Executor::run(int step, float loss_scale, const std::int32_t* tokens_all, const std::int32_t* targets_all,
                     std::int64_t batch, prof::Timeline* timeline,
                     const std::function<void(const models::Model&)>& on_forward) {
  STRATA_CHECK(strategy_ != nullptr, "a pipeline run before its state strategy");
  const int m = shape_.m;
  constexpr int kActTag = 1, kGradTag = 2;
  // Per (chunk, micro-batch) k = chunk * m + mb: its sends in flight.
  std::vector<std::vector<comm::RequestPtr>> sends(chunks_.size() * std::size_t(m));
  std::vector<int> draining;  // pairs done computing whose sends may still be in flight
  // Gives back the stage models of draining pairs whose sends completed
  // (all of them with wait, else those a test finds done), oldest first;
  // with `chunk` >= 0, waits only until one of that chunk's is free.
  auto reclaim = [&](bool wait, int chunk = -1) {
    for (std::size_t i = 0; i < draining.size();) {
      if (chunk >= 0 && !chunks_[std::size_t(chunk)].free.empty()) return;
      const int k = draining[i];
      const bool mine = chunk < 0 || k / m == chunk;
      bool complete = true;
      for (auto& r : sends[std::size_t(k)]) complete = ((wait && mine) ? (r->wait(), true) : r->test()) && complete;
      if (complete) {
        Chunk& ch = chunks_[std::size_t(k / m)];
        ch.free.push_back(ch.of_mb[std::size_t(k % m)]);
        sends[std::size_t(k)].clear();
        draining.erase(draining.begin() + std::ptrdiff_t(i));
      } else {
        ++i;
      }
    }
  };
  // A stage model for a pair that starts: one free now, after a test, or
  // after waiting for the oldest send of this chunk's draining pairs.
  auto take = [&](int chunk, int mb) {
    Chunk& ch = chunks_[std::size_t(chunk)];
    if (ch.free.empty()) reclaim(false);
    if (ch.free.empty()) reclaim(true, chunk);
    STRATA_CHECK(!ch.free.empty(), "chunk {}: no stage model free for micro-batch {}", chunk, mb);
    ch.of_mb[std::size_t(mb)] = ch.free.back();
    ch.free.pop_back();
    return ch.of_mb[std::size_t(mb)];
  };
  double loss_sum = 0;
  for (std::size_t i = 0; i < actions_.size(); ++i) {
    const Action& a = actions_[i];
    if (a.op == Op::optimizer) continue;
    if (timeline != nullptr) timeline->set_position(step, a.mb, a.chunk);
    Chunk& ch = chunks_[std::size_t(a.chunk)];
    models::ParamState& state = state_of(a.chunk);
    const std::int32_t* tokens = tokens_all + std::int64_t(a.mb) * batch;
    const std::int32_t* targets = targets_all + std::int64_t(a.mb) * batch;
    models::Model* g = ch.of_mb[std::size_t(a.mb)];
    auto& sent = sends[std::size_t(a.chunk * m + a.mb)];
    switch (a.op) {
      case Op::recv_act: {
        models::Model* m = take(a.chunk, a.mb);
        comm::recv(pp_, m->input(), m->boundary_elements(), a.peer, kActTag);
        break;
      }
      case Op::forward:
        if (live_.first_of_pair[i]) g = take(a.chunk, a.mb);  // the first stage: no activations to receive
        loss_sum += g->forward(state, tokens, targets, timeline);
        on_forward(*g);
        break;
      case Op::send_act:
        sent.push_back(comm::isend(pp_, g->output(), g->boundary_elements(), a.peer, kActTag));
        break;
      case Op::recv_grad:
        // Into the output's place: its send must have completed (it has
        // been received, or this gradient would not come).
        for (auto& r : sent) r->wait();
        sent.clear();
        comm::recv(pp_, g->output_grad(), g->boundary_elements(), a.peer, kGradTag);
        break;
      case Op::backward:
      case Op::backward_input:
        if (a.op == Op::backward) strategy_->begin_micro_batch(live_.completes_chunk[i] != 0);
        g->backward(state, tokens, targets, loss_scale, timeline, a.op == Op::backward_input);
        break;
      case Op::backward_weight:
        strategy_->begin_micro_batch(live_.completes_chunk[i] != 0);
        g->backward_weight(state, timeline);
        break;
      case Op::send_grad:
        sent.push_back(comm::isend(pp_, g->input_grad(), g->boundary_elements(), a.peer, kGradTag));
        break;
      case Op::optimizer:
        break;
    }
    if (live_.last_of_pair[i]) draining.push_back(a.chunk * m + a.mb);
  }
  reclaim(true);
  // Only the last stage computed the loss.
  pp_.all_reduce(&loss_sum, 1, comm::DType::f64, comm::ReduceOp::sum);
  return loss_sum;
}

}  // namespace strata::strategies::pp
