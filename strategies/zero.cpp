#include "strategies/zero.hpp"

#include <cstring>

#include <algorithm>

#include "kernels/kernels.hpp"
#include "src/core/error.hpp"

namespace strata::strategies {

using core::MemCategory;

Zero::Zero(const StateConfig& cfg, const models::ParamRegistry& reg, std::vector<models::Unit> units,
           comm::Communicator* dp, core::MemoryTracker& tracker)
    : stage_(cfg.zero), reg_(reg), units_(std::move(units)), dp_(dp), tracker_(tracker),
      tp_size_(cfg.tp_size), bucket_bytes_(cfg.bucket_bytes) {
  STRATA_CHECK(stage_ >= 1 && stage_ <= 3, "ZeRO stage {}", stage_);
  if (dp_ != nullptr) {
    n_ = dp_->size();
    r_ = dp_->rank();
  }
  for (const auto& u : units_) {
    UnitShard s;
    s.size = u.size();
    s.shard = (s.size + n_ - 1) / n_;
    s.q = shard_total_;
    s.own_begin = std::min(u.end, u.begin + std::int64_t(r_) * s.shard);
    s.own_end = std::min(u.end, s.own_begin + s.shard);
    shard_total_ += s.shard;
    us_.push_back(s);
  }
  const std::size_t full = std::size_t(n_) * std::size_t(shard_total_), shard = std::size_t(shard_total_);
  if (stage_ <= 2) {
    params_full_ = core::Buffer<float>(tracker, MemCategory::params, full, "parameters (padded)");
    for (std::size_t u = 0; u < units_.size(); ++u)
      models::init_flat_range(reg_, cfg.seed, units_[u].begin, units_[u].end, params_full_.data() + n_ * us_[u].q);
  } else {
    params_shard_ = core::Buffer<float>(tracker, MemCategory::params, shard, "parameter shard");
    for (std::size_t u = 0; u < units_.size(); ++u)
      models::init_flat_range(reg_, cfg.seed, us_[u].own_begin, us_[u].own_end, params_shard_.data() + us_[u].q);
  }
  if (stage_ == 1)
    grads_full_ = core::Buffer<float>(tracker, MemCategory::grads, full, "gradients (padded)");
  else
    grads_shard_ = core::Buffer<float>(tracker, MemCategory::grads, shard, "gradient shard");
  for (const auto& s : us_)
    optimizers_.push_back(
        std::make_unique<models::AdamW>(reg_, s.own_begin, s.own_end, cfg.adamw, tracker, s.shard, cfg.offload));
  unit_grads_.resize(units_.size());
  gathered_.resize(units_.size());
}

Zero::~Zero() = default;

float* Zero::own_params(int u) {
  const auto& s = us_[u];
  return stage_ <= 2 ? params_full_.data() + n_ * s.q + r_ * s.shard : params_shard_.data() + s.q;
}

float* Zero::own_grads(int u) {
  const auto& s = us_[u];
  return stage_ == 1 ? grads_full_.data() + n_ * s.q + r_ * s.shard : grads_shard_.data() + s.q;
}

void Zero::begin_step() {
  STRATA_CHECK(pending_.empty(), "reduce-scatters still in flight at the start of a step");
  if (stage_ == 1)
    kernels::fill_zero(grads_full_.data(), std::int64_t(grads_full_.size()));
  else
    kernels::fill_zero(grads_shard_.data(), std::int64_t(grads_shard_.size()));
}

float* Zero::acquire_params(int u) {
  if (stage_ <= 2) return params_full_.data() + n_ * us_[u].q;
  auto& g = gathered_[u];
  if (g.data.size() == 0) prefetch(u);
  if (g.request) {
    g.request->wait();
    g.request.reset();
  }
  ++g.refs;
  return g.data.data();
}

void Zero::release_params(int u) {
  if (stage_ <= 2) return;
  auto& g = gathered_[u];
  STRATA_CHECK(g.refs > 0, "unit {} released more often than acquired", u);
  if (--g.refs == 0) g.data.reset();
}

void Zero::prefetch(int u) {
  if (stage_ <= 2 || u < 0 || u >= int(units_.size())) return;
  auto& g = gathered_[u];
  if (g.data.size() != 0) return;
  const auto& s = us_[u];
  g.data = core::Buffer<float>(tracker_, MemCategory::params, std::size_t(n_ * s.shard), "gathered unit");
  if (n_ > 1)
    g.request = dp_->iall_gather(params_shard_.data() + s.q, g.data.data(), s.shard, comm::DType::f32);
  else
    std::memcpy(g.data.data(), params_shard_.data() + s.q, sizeof(float) * std::size_t(s.shard));
}

float* Zero::grads(int u) {
  if (stage_ == 1) return grads_full_.data() + n_ * us_[u].q;
  auto& b = unit_grads_[u];
  if (b.size() == 0)  // the tracker hands out zeroed memory
    b = core::Buffer<float>(tracker_, MemCategory::comm, std::size_t(n_ * us_[u].shard), "unreduced unit gradients");
  return b.data();
}

void Zero::launch_reduce_scatter(int u, core::Buffer<float> input, const float* src) {
  const auto& s = us_[u];
  Pending p{u, std::move(input),
            core::Buffer<float>(tracker_, MemCategory::comm, std::size_t(s.shard), "reduce-scatter output"), nullptr};
  in_flight_bytes_ += std::int64_t(p.input.bytes());
  if (n_ > 1)
    p.request = dp_->ireduce_scatter(src, p.output.data(), s.shard, comm::DType::f32, comm::ReduceOp::sum);
  else
    std::memcpy(p.output.data(), src, sizeof(float) * std::size_t(s.shard));
  pending_.push_back(std::move(p));
}

void Zero::grads_done(int u) {
  if (stage_ == 1) {
    // Stage 1 keeps whole gradients through accumulation and reduces once.
    if (last_) launch_reduce_scatter(u, core::Buffer<float>(), grads_full_.data() + n_ * us_[u].q);
  } else {
    // Stages 2 and 3 reduce every micro-batch into the shard, so no rank
    // ever holds more than its shard between micro-batches. A split backward
    // may already have reduced this micro-batch's part with another's (its
    // input-gradient half wrote before the other's weight-gradient half said
    // done): nothing is left, and every dp rank, running the same schedule,
    // skips alike.
    if (unit_grads_[u].size() == 0) return;
    core::Buffer<float> b = std::move(unit_grads_[u]);
    const float* src = b.data();
    launch_reduce_scatter(u, std::move(b), src);
  }
  poll();
  // Bound the unreduced gradients held at once, as DeepSpeed's reduce bucket
  // does: past parallel.bucket_mb, wait for the oldest reduce-scatters.
  while (in_flight_bytes_ > bucket_bytes_ && pending_.size() > 1) pop_front();
}

void Zero::pop_front() {
  complete(pending_.front());
  in_flight_bytes_ -= std::int64_t(pending_.front().input.bytes());
  pending_.erase(pending_.begin());
}

void Zero::complete(Pending& p) {
  if (p.request) p.request->wait();
  const auto& s = us_[p.unit];
  if (stage_ == 1)
    std::memcpy(own_grads(p.unit), p.output.data(), sizeof(float) * std::size_t(s.shard));
  else
    kernels::add_inplace(own_grads(p.unit), p.output.data(), s.shard);
}

void Zero::poll() {
  // Complete in launch order, so the sums are the same whatever the timing.
  while (!pending_.empty() && (!pending_.front().request || pending_.front().request->test())) pop_front();
  for (auto& p : pending_)
    if (p.request) p.request->test();  // MPICH progresses only inside MPI calls
}

void Zero::finish_gradients() {
  while (!pending_.empty()) pop_front();
}

double Zero::grad_norm_sq() {
  double sq = 0;
  for (std::size_t u = 0; u < us_.size(); ++u)
    sq += models::grad_sum_squares(reg_, own_grads(int(u)), us_[u].own_begin, us_[u].own_end, tp_size_);
  if (n_ > 1) dp_->all_reduce(&sq, 1, comm::DType::f64, comm::ReduceOp::sum);
  return sq;
}

void Zero::update(float coef, float lr, int step) {
  for (std::size_t u = 0; u < us_.size(); ++u) {
    const std::int64_t k = us_[u].own_end - us_[u].own_begin;
    if (k == 0) continue;
    if (coef != 1.0f) kernels::scale_inplace(own_grads(int(u)), coef, k);
    optimizers_[u]->update(own_params(int(u)), own_grads(int(u)), lr, step);
  }
  if (stage_ <= 2 && n_ > 1) {
    // Every rank's updated block back into everyone's replicated parameters.
    std::vector<comm::RequestPtr> reqs;
    for (std::size_t u = 0; u < us_.size(); ++u)
      reqs.push_back(dp_->iall_gather(own_params(int(u)), params_full_.data() + n_ * us_[u].q, us_[u].shard,
                                      comm::DType::f32));
    for (auto& r : reqs) r->wait();
  }
}

std::vector<float> Zero::gather_unit(int u, const float* mine) {
  const auto& s = us_[u];
  std::vector<float> all(std::size_t(n_ * s.shard));
  if (n_ > 1)
    dp_->all_gather(mine, all.data(), s.shard, comm::DType::f32);
  else
    std::memcpy(all.data(), mine, sizeof(float) * std::size_t(s.shard));
  return all;
}

std::vector<float> Zero::full_params() {
  std::vector<float> out(std::size_t(reg_.numel()));
  for (std::size_t u = 0; u < us_.size(); ++u) {
    const auto& s = us_[u];
    std::vector<float> gathered;
    const float* src = params_full_.data() + n_ * s.q;
    if (stage_ > 2) src = (gathered = gather_unit(int(u), params_shard_.data() + s.q)).data();
    std::memcpy(out.data() + units_[u].begin, src, sizeof(float) * std::size_t(s.size));
  }
  return out;
}

std::vector<StateTensor> Zero::state_tensors() {
  // Stages 1-2 hold every parameter (the padded full buffer), stage 3 its
  // shard; the moments are per unit shard.
  std::vector<StateTensor> out;
  if (stage_ <= 2)
    out.push_back({"params", params_full_.data(), std::int64_t(params_full_.size())});
  else
    out.push_back({"params", params_shard_.data(), std::int64_t(params_shard_.size())});
  for (std::size_t u = 0; u < optimizers_.size(); ++u) {
    out.push_back({"unit" + std::to_string(u) + ".adam_m", optimizers_[u]->m(), optimizers_[u]->capacity()});
    out.push_back({"unit" + std::to_string(u) + ".adam_v", optimizers_[u]->v(), optimizers_[u]->capacity()});
  }
  return out;
}

FullState Zero::full_state() {
  FullState out;
  out.params = full_params();
  // Each rank's moments cover its block of every unit: gathered unit by unit.
  for (auto* which : {&out.m, &out.v}) {
    which->assign(std::size_t(reg_.numel()), 0.0f);
    for (std::size_t u = 0; u < us_.size(); ++u) {
      const std::vector<float> all =
          gather_unit(int(u), which == &out.m ? optimizers_[u]->m() : optimizers_[u]->v());
      std::copy(all.begin(), all.begin() + us_[u].size, which->begin() + units_[u].begin);
    }
  }
  return out;
}

void Zero::set_full_state(const FullState& st) {
  for (std::size_t u = 0; u < us_.size(); ++u) {
    const auto& s = us_[u];
    const float* p = st.params.data() + units_[u].begin;
    if (stage_ <= 2)
      std::copy(p, p + s.size, params_full_.data() + n_ * s.q);
    else
      std::copy(st.params.data() + s.own_begin, st.params.data() + s.own_end, params_shard_.data() + s.q);
    std::copy(st.m.data() + s.own_begin, st.m.data() + s.own_end, optimizers_[u]->m());
    std::copy(st.v.data() + s.own_begin, st.v.data() + s.own_end, optimizers_[u]->v());
  }
}

}  // namespace strata::strategies
