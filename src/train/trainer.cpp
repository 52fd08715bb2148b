#include "src/train/trainer.hpp"

#include <cmath>

#include "kernels/kernels.hpp"
#include "src/core/error.hpp"
#include "src/prof/clock.hpp"
#include "src/train/lr_schedule.hpp"

namespace strata::train {

models::GptConfig gpt_config(const deck::ModelSection& m) {
  return models::GptConfig{m.layers, m.d_model, m.heads, m.ffn_mult, m.vocab, m.seq_len};
}

Trainer::Trainer(const deck::Config& config, core::MemoryTracker& tracker, prof::Timeline* timeline,
                 double peak_flops, comm::Communicator* dp, comm::Communicator* tp, comm::Communicator* pp,
                 comm::Communicator* emb)
    : cfg_(config), timeline_(timeline), peak_flops_(peak_flops), dp_(dp),
      tp_(tp != nullptr && tp->size() > 1 ? tp : nullptr), pp_(pp != nullptr && pp->size() > 1 ? pp : nullptr),
      tracker_(&tracker) {
  if (dp_ != nullptr) {
    dp_size_ = dp_->size();
    dp_rank_ = dp_->rank();
  }
  const auto gc = gpt_config(cfg_.model);
  const int B = cfg_.data.micro_batch, T = cfg_.model.seq_len;
  STRATA_CHECK(cfg_.data.global_batch % (dp_size_ * B) == 0, "global batch {} over dp {} x micro-batch {}",
               cfg_.data.global_batch, dp_size_, B);
  micro_batches_ = cfg_.data.global_batch / (dp_size_ * B);
  model_flops_per_step_ = models::gpt_model_flops(gc, cfg_.data.global_batch);
  if (tp_ != nullptr) tpc_ = {tp_, tp_->size(), tp_->rank(), cfg_.parallel.sequence_parallel};
  if (pp_ != nullptr) {
    pp_rank_ = pp_->rank();
    stage_ = models::gpt_stage(gc, pp_rank_, pp_->size());
    emb_ = emb != nullptr && emb->size() > 1 ? emb : nullptr;
    const strategies::pp::Shape shape{pp_->size(), micro_batches_, 1};
    schedule_ = strategies::pp::make_schedule(cfg_.parallel.schedule, shape)[pp_rank_];
    for (const auto& a : schedule_)
      if (a.op == strategies::pp::Op::backward) last_backward_mb_ = a.mb;
    mb_tokens_ = core::Buffer<std::int32_t>(tracker, core::MemCategory::activations,
                                            std::size_t(micro_batches_) * B * T, "tokens of the step");
    mb_targets_ = core::Buffer<std::int32_t>(tracker, core::MemCategory::activations,
                                             std::size_t(micro_batches_) * B * T, "targets of the step");
  }
  model_ = std::make_unique<models::Gpt>(gc, B, tracker, tpc_, stage_);
  slots_.push_back(model_.get());
  free_.push_back(model_.get());
  slot_of_.assign(std::size_t(micro_batches_), nullptr);
  strategies::StateConfig sc;
  sc.zero = cfg_.parallel.zero;
  sc.bucket_bytes = std::int64_t(cfg_.parallel.bucket_mb * double(1 << 20));
  sc.adamw = {float(cfg_.optim.beta1), float(cfg_.optim.beta2), float(cfg_.optim.eps),
              float(cfg_.optim.weight_decay)};
  sc.seed = cfg_.run.seed;
  sc.tp_size = tpc_.size;
  strategy_ = strategies::make_state_strategy(sc, *model_, dp_, tracker);
  data_ = make_data_source(cfg_);
  tokens_ = core::Buffer<std::int32_t>(tracker, core::MemCategory::activations, std::size_t(B) * T, "tokens");
  targets_ = core::Buffer<std::int32_t>(tracker, core::MemCategory::activations, std::size_t(B) * T, "targets");
  if (timeline_ != nullptr && timeline_->enabled())
    timeline_->reserve(std::size_t(cfg_.run.steps) * (micro_batches_ * 2 * (gc.layers + 2) + 1));
}

StepRecord Trainer::step(int step) {
  const int T = cfg_.model.seq_len;
  const double t0 = prof::now_seconds();
  StepRecord r;
  r.step = step;
  r.warmup = step < cfg_.run.warmup_steps;

  // The mean loss over the global batch: every micro-batch's mean weighs
  // 1 / (micro-batches x dp), and the dp ranks' gradients are summed.
  const float loss_scale = 1.0f / float(micro_batches_ * dp_size_);
  strategy_->begin_step();
  r.loss = (pp_ != nullptr ? run_pipeline(step, loss_scale) : run_micro_batches(step, loss_scale)) * loss_scale;
  if (dp_size_ > 1) dp_->all_reduce(&r.loss, 1, comm::DType::f64, comm::ReduceOp::sum);

  {
    prof::ScopedSpan span(timeline_, -1, prof::Phase::optimizer);
    strategy_->finish_gradients();
    // The tied word embedding lives on the first and the last stage: each
    // copy's gradient becomes their sum, so both take the same update.
    if (emb_ != nullptr) {
      const auto& wte = model_->registry().find("wte");
      float* g = strategy_->whole_grad(wte);
      STRATA_CHECK(g != nullptr, "the pipeline's tied embedding needs whole gradients (zero = 0)");
      emb_->all_reduce(g, wte.numel, comm::DType::f32, comm::ReduceOp::sum);
    }
    double sq = strategy_->grad_norm_sq();
    if (tp_ != nullptr) tp_->all_reduce(&sq, 1, comm::DType::f64, comm::ReduceOp::sum);
    if (pp_ != nullptr) pp_->all_reduce(&sq, 1, comm::DType::f64, comm::ReduceOp::sum);
    r.grad_norm = std::sqrt(sq);
    // As torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
    float coef = 1.0f;
    if (cfg_.optim.grad_clip > 0) {
      const double c = cfg_.optim.grad_clip / (r.grad_norm + 1e-6);
      if (c < 1.0) {
        coef = float(c);
        r.clipped = true;
      }
    }
    r.lr = learning_rate(cfg_.optim, step, cfg_.run.steps);
    strategy_->update(coef, float(r.lr), step + 1);
  }

  r.step_time = prof::now_seconds() - t0;
  r.tokens = double(cfg_.data.global_batch) * T;
  r.tokens_per_s = r.tokens / r.step_time;
  r.model_flops = model_flops_per_step_;
  r.flops_per_s = r.model_flops / r.step_time;
  r.mfu = peak_flops_ > 0 ? r.flops_per_s / peak_flops_ : 0.0;
  return r;
}

double Trainer::run_micro_batches(int step, float loss_scale) {
  const int B = cfg_.data.micro_batch, T = cfg_.model.seq_len;
  models::ParamState& state = strategy_->state();
  double loss_sum = 0;
  for (int mb = 0; mb < micro_batches_; ++mb) {
    if (timeline_ != nullptr) timeline_->set_position(step, mb);
    strategy_->begin_micro_batch(mb == micro_batches_ - 1);
    const std::int64_t first = std::int64_t(step) * cfg_.data.global_batch +
                               std::int64_t(dp_rank_) * (cfg_.data.global_batch / dp_size_) + std::int64_t(mb) * B;
    fill_batch(*data_, first, B, T, tokens_.data(), targets_.data());
    loss_sum += model_->forward(state, tokens_.data(), targets_.data(), timeline_);
    model_->backward(state, tokens_.data(), targets_.data(), loss_scale, timeline_);
  }
  return loss_sum;
}

models::Gpt* Trainer::take_slot(int mb) {
  if (free_.empty()) {
    // One more micro-batch in flight than ever before on this rank: another
    // stage model for its activations (parameters stay in the state).
    extra_slots_.push_back(
        std::make_unique<models::Gpt>(gpt_config(cfg_.model), cfg_.data.micro_batch, *tracker_, tpc_, stage_));
    slots_.push_back(extra_slots_.back().get());
    free_.push_back(slots_.back());
  }
  slot_of_[mb] = free_.back();
  free_.pop_back();
  return slot_of_[mb];
}

// Runs this rank's actions of the schedule. Sends are non-blocking (the
// schedules are deadlock-free when sends never block); a slot goes back to
// the free list once its backward ran and its sends completed, so the stage
// models in use follow the schedule's micro-batches in flight (1F1B: at most
// p - rank; GPipe: all m). Receives block, and the communicator records how
// long each waited.
double Trainer::run_pipeline(int step, float loss_scale) {
  using strategies::pp::Op;
  const int B = cfg_.data.micro_batch, T = cfg_.model.seq_len, C = cfg_.model.d_model;
  const bool sp = tp_ != nullptr && cfg_.parallel.sequence_parallel;
  const std::int64_t count = std::int64_t(B) * T / (sp ? tp_->size() : 1) * C;
  constexpr int kActTag = 1, kGradTag = 2;
  models::ParamState& state = strategy_->state();
  std::vector<std::vector<comm::RequestPtr>> sends(static_cast<std::size_t>(micro_batches_));
  std::vector<int> draining;  // micro-batches whose slot has finished computing
  auto reclaim = [&](bool wait) {
    for (std::size_t i = 0; i < draining.size();) {
      const int mb = draining[i];
      bool complete = true;
      for (auto& r : sends[mb]) complete = (wait ? (r->wait(), true) : r->test()) && complete;
      if (complete) {
        free_.push_back(slot_of_[mb]);
        sends[mb].clear();
        draining.erase(draining.begin() + std::ptrdiff_t(i));
      } else {
        ++i;
      }
    }
  };
  auto slot = [&](int mb) {
    if (free_.empty()) reclaim(false);
    return take_slot(mb);
  };
  double loss_sum = 0;
  auto batch = [&](int mb, std::int32_t* base) { return base + std::size_t(mb) * B * T; };
  if (stage_.embedding || stage_.head)
    for (int mb = 0; mb < micro_batches_; ++mb) {
      const std::int64_t first = std::int64_t(step) * cfg_.data.global_batch +
                                 std::int64_t(dp_rank_) * (cfg_.data.global_batch / dp_size_) + std::int64_t(mb) * B;
      fill_batch(*data_, first, B, T, batch(mb, mb_tokens_.data()), batch(mb, mb_targets_.data()));
    }
  for (const auto& a : schedule_) {
    if (timeline_ != nullptr) timeline_->set_position(step, a.mb < 0 ? 0 : a.mb);
    switch (a.op) {
      case Op::recv_act:
        pp_->recv(slot(a.mb)->input(), count, comm::DType::f32, a.peer, kActTag);
        break;
      case Op::forward: {
        models::Gpt* g = stage_.embedding ? slot(a.mb) : slot_of_[a.mb];
        loss_sum += g->forward(state, batch(a.mb, mb_tokens_.data()), batch(a.mb, mb_targets_.data()), timeline_);
        break;
      }
      case Op::send_act:
        sends[a.mb].push_back(pp_->isend(slot_of_[a.mb]->output(), count, comm::DType::f32, a.peer, kActTag));
        break;
      case Op::recv_grad:
        pp_->recv(slot_of_[a.mb]->output_grad(), count, comm::DType::f32, a.peer, kGradTag);
        break;
      case Op::backward:
        strategy_->begin_micro_batch(a.mb == last_backward_mb_);
        slot_of_[a.mb]->backward(state, batch(a.mb, mb_tokens_.data()), batch(a.mb, mb_targets_.data()),
                                 loss_scale, timeline_);
        if (stage_.embedding) draining.push_back(a.mb);
        break;
      case Op::send_grad:
        sends[a.mb].push_back(pp_->isend(slot_of_[a.mb]->input_grad(), count, comm::DType::f32, a.peer, kGradTag));
        draining.push_back(a.mb);
        break;
      case Op::optimizer:
        break;
      default:
        core::runtime_error("the pipeline executor does not run {} actions yet", strategies::pp::op_name(a.op));
    }
  }
  reclaim(true);
  // Only the last stage computed the loss.
  pp_->all_reduce(&loss_sum, 1, comm::DType::f64, comm::ReduceOp::sum);
  return loss_sum;
}

}  // namespace strata::train
