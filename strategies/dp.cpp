#include "strategies/dp.hpp"

#include <algorithm>

#include "kernels/kernels.hpp"

namespace strata::strategies {

DataParallel::DataParallel(const StateConfig& cfg, const models::ParamRegistry& reg, std::vector<models::Unit> units,
                           comm::Communicator* dp, core::MemoryTracker& tracker)
    : models::ReplicatedState(reg, std::move(units), tracker, cfg.seed), reg_(reg), tp_size_(cfg.tp_size),
      dp_(dp != nullptr && dp->size() > 1 ? dp : nullptr), optimizer_(reg, 0, reg.numel(), cfg.adamw, tracker, -1, cfg.offload) {
  const std::int64_t n = numel();
  const std::int64_t per = std::max<std::int64_t>(1, cfg.bucket_bytes / std::int64_t(sizeof(float)));
  for (std::int64_t hi = n; hi > 0; hi -= per) buckets_.push_back({std::max<std::int64_t>(0, hi - per), hi});
}

void DataParallel::begin_step() {
  zero_grads();
  launched_ = 0;
  in_flight_.clear();
}

void DataParallel::launch_ready(std::int64_t watermark) {
  while (launched_ < buckets_.size() && buckets_[launched_].begin >= watermark) {
    const auto& b = buckets_[launched_++];
    in_flight_.push_back(dp_->iall_reduce(grads_.data() + b.begin, b.end - b.begin, comm::DType::f32,
                                          comm::ReduceOp::sum));
  }
  // MPICH progresses non-blocking collectives only inside MPI calls: poll.
  for (auto& r : in_flight_) r->test();
}

void DataParallel::grads_done(int unit) {
  // Units complete from the last to the first, so everything at or above this
  // unit's first element is final.
  if (dp_ != nullptr && last_) launch_ready(units_[unit].begin);
}

void DataParallel::finish_gradients() {
  if (dp_ == nullptr) return;
  launch_ready(0);
  for (auto& r : in_flight_) r->wait();
  in_flight_.clear();
}

double DataParallel::grad_norm_sq() { return models::grad_sum_squares(reg_, grads_.data(), 0, numel(), tp_size_); }

void DataParallel::update(float coef, float lr, int step) {
  if (coef != 1.0f) kernels::scale_inplace(grads_.data(), coef, numel());
  optimizer_.update(params_.data(), grads_.data(), lr, step);
}

std::vector<float> DataParallel::full_params() { return std::vector<float>(params_.data(), params_.data() + numel()); }

FullState DataParallel::full_state() {
  const std::size_t n = std::size_t(numel());
  return {std::vector<float>(params_.data(), params_.data() + n), std::vector<float>(optimizer_.m(), optimizer_.m() + n),
          std::vector<float>(optimizer_.v(), optimizer_.v() + n)};
}

void DataParallel::set_full_state(const FullState& s) {
  std::copy(s.params.begin(), s.params.end(), params_.data());
  std::copy(s.m.begin(), s.m.end(), optimizer_.m());
  std::copy(s.v.begin(), s.v.end(), optimizer_.v());
}

}  // namespace strata::strategies
