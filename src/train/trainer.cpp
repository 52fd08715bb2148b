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
                 double peak_flops, comm::Communicator* dp, comm::Communicator* tp)
    : cfg_(config), timeline_(timeline), peak_flops_(peak_flops), dp_(dp),
      tp_(tp != nullptr && tp->size() > 1 ? tp : nullptr) {
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
  models::TensorParallel tpc;
  if (tp_ != nullptr) tpc = {tp_, tp_->size(), tp_->rank(), cfg_.parallel.sequence_parallel};
  model_ = std::make_unique<models::Gpt>(gc, B, tracker, tpc);
  strategies::StateConfig sc;
  sc.zero = cfg_.parallel.zero;
  sc.bucket_bytes = std::int64_t(cfg_.parallel.bucket_mb * double(1 << 20));
  sc.adamw = {float(cfg_.optim.beta1), float(cfg_.optim.beta2), float(cfg_.optim.eps),
              float(cfg_.optim.weight_decay)};
  sc.seed = cfg_.run.seed;
  sc.tp_size = tpc.size;
  strategy_ = strategies::make_state_strategy(sc, *model_, dp_, tracker);
  data_ = make_data_source(cfg_);
  tokens_ = core::Buffer<std::int32_t>(tracker, core::MemCategory::activations, std::size_t(B) * T, "tokens");
  targets_ = core::Buffer<std::int32_t>(tracker, core::MemCategory::activations, std::size_t(B) * T, "targets");
  if (timeline_ != nullptr && timeline_->enabled())
    timeline_->reserve(std::size_t(cfg_.run.steps) * (micro_batches_ * 2 * (gc.layers + 2) + 1));
}

StepRecord Trainer::step(int step) {
  const int B = cfg_.data.micro_batch, T = cfg_.model.seq_len;
  const double t0 = prof::now_seconds();
  StepRecord r;
  r.step = step;
  r.warmup = step < cfg_.run.warmup_steps;

  // The mean loss over the global batch: every micro-batch's mean weighs
  // 1 / (micro-batches x dp), and the dp ranks' gradients are summed.
  const float loss_scale = 1.0f / float(micro_batches_ * dp_size_);
  models::ParamState& state = strategy_->state();
  strategy_->begin_step();
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
  r.loss = loss_sum * loss_scale;
  if (dp_size_ > 1) dp_->all_reduce(&r.loss, 1, comm::DType::f64, comm::ReduceOp::sum);

  {
    prof::ScopedSpan span(timeline_, -1, prof::Phase::optimizer);
    double sq = strategy_->finish_gradients();
    if (tp_ != nullptr) tp_->all_reduce(&sq, 1, comm::DType::f64, comm::ReduceOp::sum);
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

}  // namespace strata::train
