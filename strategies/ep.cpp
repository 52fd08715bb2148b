#include "strategies/ep.hpp"

#include <algorithm>
#include <cstring>

#include "kernels/foundation/error.hpp"

namespace strata::strategies {

std::unique_ptr<models::ExpertSeam> make_expert_seam(comm::Communicator* ep) {
  if (ep == nullptr || ep->size() == 1) return std::make_unique<models::OneExpertRank>();
  return std::make_unique<ExpertParallelSeam>(*ep);
}

ExpertParallelState::ExpertParallelState(const StateConfig& cfg, const models::ParamRegistry& reg,
                                         std::vector<models::Unit> units, comm::Communicator* dp,
                                         comm::Communicator* ep, comm::Communicator* edp,
                                         core::MemoryTracker& tracker, Make make)
    : units_(std::move(units)), ep_(ep) {
  // A unit is an expert unit when its parameters are experts' (a MoE
  // layer's experts are a unit of their own).
  std::vector<models::Unit> dense_units, expert_units;
  for (const auto& u : units_) {
    int experts = 0, params = 0;
    for (const auto& s : reg.specs())
      if (s.offset >= u.begin && s.offset < u.end) ++params, experts += s.expert;
    STRATA_CHECK(experts == 0 || experts == params, "a unit mixes expert and dense parameters");
    const bool is_expert = params > 0 && experts == params;
    models::ParamRegistry& sub = is_expert ? expert_reg_ : dense_reg_;
    auto& sub_units = is_expert ? expert_units : dense_units;
    expert_.push_back(is_expert);
    local_.push_back(int(sub_units.size()));
    sub_units.push_back({sub.numel(), sub.numel() + u.size()});
    sub.append_range(reg, u.begin, u.end);
  }
  dense_ = make(cfg, dense_reg_, std::move(dense_units), dp, tracker);
  experts_ = make(cfg, expert_reg_, std::move(expert_units), edp, tracker);
}

void ExpertParallelState::begin_step() {
  dense_->begin_step();
  experts_->begin_step();
}

void ExpertParallelState::begin_micro_batch(bool last) {
  dense_->begin_micro_batch(last);
  experts_->begin_micro_batch(last);
}

void ExpertParallelState::finish_gradients() {
  experts_->finish_gradients();
  dense_->finish_gradients();
}

double ExpertParallelState::grad_norm_sq() {
  double experts = experts_->grad_norm_sq();
  if (ep_ != nullptr && ep_->size() > 1) ep_->all_reduce(&experts, 1, comm::DType::f64, comm::ReduceOp::sum);
  return dense_->grad_norm_sq() + experts;
}

void ExpertParallelState::update(float coef, float lr, int step) {
  dense_->update(coef, lr, step);
  experts_->update(coef, lr, step);
}

std::vector<float> ExpertParallelState::merge(const std::vector<float>& d, const std::vector<float>& e) const {
  std::int64_t n = 0;
  for (const auto& u : units_) n = std::max(n, u.end);
  std::vector<float> out(std::size_t(n), 0.0f);
  std::int64_t dense_at = 0, expert_at = 0;
  for (std::size_t u = 0; u < units_.size(); ++u) {
    std::int64_t& at = expert_[u] ? expert_at : dense_at;
    const std::vector<float>& from = expert_[u] ? e : d;
    std::memcpy(out.data() + units_[u].begin, from.data() + at, sizeof(float) * std::size_t(units_[u].size()));
    at += units_[u].size();
  }
  return out;
}

void ExpertParallelState::split(const std::vector<float>& whole, std::vector<float>* d, std::vector<float>* e) const {
  d->clear();
  e->clear();
  for (std::size_t u = 0; u < units_.size(); ++u) {
    std::vector<float>& to = expert_[u] ? *e : *d;
    to.insert(to.end(), whole.begin() + units_[u].begin, whole.begin() + units_[u].end);
  }
}

std::vector<float> ExpertParallelState::full_params() { return merge(dense_->full_params(), experts_->full_params()); }

FullState ExpertParallelState::full_state() {
  const FullState d = dense_->full_state(), e = experts_->full_state();
  return {merge(d.params, e.params), merge(d.m, e.m), merge(d.v, e.v)};
}

void ExpertParallelState::set_full_state(const FullState& s) {
  FullState d, e;
  split(s.params, &d.params, &e.params);
  split(s.m, &d.m, &e.m);
  split(s.v, &d.v, &e.v);
  dense_->set_full_state(d);
  experts_->set_full_state(e);
}

std::int64_t ExpertParallelState::padding_elements() const {
  return dense_->padding_elements() + experts_->padding_elements();
}

std::vector<StateTensor> ExpertParallelState::state_tensors() {
  std::vector<StateTensor> out;
  for (auto* kind : {dense_.get(), experts_.get()})
    for (StateTensor t : kind->state_tensors()) {
      t.name = (kind == dense_.get() ? "dense." : "experts.") + t.name;
      out.push_back(std::move(t));
    }
  return out;
}

}  // namespace strata::strategies
