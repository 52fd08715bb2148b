#include "strategies/zero.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "kernels/kernels.hpp"
#include "models/nvme.hpp"
#include "kernels/foundation/error.hpp"
#include "plan/plan.hpp"
#include "strategies/registry.hpp"

namespace strata::strategies {

namespace {

// Reducing every micro-batch's gradients into the shard needs a gradient
// shard (ZeRO 2 or 3). Hybrid sharding cuts each dp group into groups of
// dp_shard ranks, and shards what ZeRO shards: it needs a stage.
void check_zero(const plan::Plan& p, PlanChecks& checks) {
  const auto& q = p.parallel;
  if (q.grad_sync == plan::GradSync::micro_batch && q.zero < 2)
    checks.error({"parallel.grad_sync", "parallel.zero"},
                 fmt::format("{} reduces each micro-batch's gradients into the rank's gradient shard, but {} holds "
                             "whole gradients: set parallel.zero to 2 or 3, or grad_sync to \"step\" or \"auto\"",
                             checks.show("parallel.grad_sync"), checks.show("parallel.zero")));
  if (q.dp_shard == 0 || q.dp_shard == q.dp) return;
  if (q.dp % q.dp_shard != 0)
    checks.error({"parallel.dp_shard", "parallel.dp"},
                 fmt::format("{} does not divide {}: hybrid sharding splits each data-parallel group into groups of "
                             "dp_shard ranks (0 or dp: one group)",
                             checks.show("parallel.dp_shard"), checks.show("parallel.dp")));
  if (q.zero == 0)
    checks.error({"parallel.dp_shard", "parallel.zero"},
                 fmt::format("{} shards ZeRO's state, but {}: set parallel.zero to 1, 2 or 3, or dp_shard to 0",
                             checks.show("parallel.dp_shard"), checks.show("parallel.zero")));
}

// Hybrid sharding's cut of dp: shard groups of dp_shard consecutive dp
// ranks, and the replica groups of those at the same place in each.
void zero_axes(const plan::Plan& p, mesh::Layout& l) {
  const int s = p.parallel.dp_shard > 0 ? p.parallel.dp_shard : p.parallel.dp;
  const bool hybrid = s < p.parallel.dp;
  using Cut = mesh::Group::Cut;
  mesh::add_group(l, {.name = "dp_shard", .dims = {"dp"}, .cut = Cut::within, .block = s, .shown = hybrid,
                      .doc = "hybrid sharding's shard group: its ZeRO traffic"});
  mesh::add_group(l, {.name = "dp_replica", .dims = {"dp"}, .cut = Cut::across, .block = s, .shown = hybrid,
                      .doc = "the ranks holding the same shard in the other shard groups: the all-reduce of its "
                             "gradients"});
}

std::vector<std::string> zero_stages(const Space&, const plan::Plan&) {
  return {"0", "1", "2", "3"};
}

// ZeRO over the whole dp group, or (hybrid sharding, with a stage) over the
// dp ranks of one node, replicated across nodes.
std::vector<std::string> shard_sizes(const Space& s, const plan::Plan& p) {
  const int dp = p.parallel.dp, node = std::max(1, s.per_node / p.parallel.tp);
  if (p.parallel.zero > 0 && node > 1 && node < dp && dp % node == 0) return {"0", std::to_string(node)};
  return {"0"};
}

void zero_parts(const plan::Plan&, const MeshGroups& mesh, Parallel& out) {
  if (several(mesh.group("dp_replica")) == nullptr) return;
  out.shard = mesh.group("dp_shard");
  out.replica = mesh.group("dp_replica");
}

}  // namespace

const StateRow& zero_row() {
  using plan::key, plan::Plan, plan::ParallelSection;
  static const StateRow row{
      {"zero", "ZeRO stages 1-3, sharded per unit as FSDP: optimizer state, then gradients, then parameters",
       {key<&Plan::parallel, &ParallelSection::zero>(
            "parallel", "zero", "ZeRO stage: 0 off, 1 optimizer state, 2 +gradients, 3 +parameters sharded over dp")
            .between(0, 3),
        key<&Plan::parallel, &ParallelSection::dp_shard>(
            "parallel", "dp_shard",
            "hybrid sharding: ZeRO shards over groups of dp_shard consecutive dp ranks and replicates across the "
            "dp / dp_shard groups, whose shards' gradients are all-reduced once a step; 0 (or dp): one group")
            .at_least(0),
        key<&Plan::parallel, &ParallelSection::grad_sync>(
            "parallel", "grad_sync",
            "when the gradients accumulated over a step's micro-batches are reduced over dp: step, once, from whole "
            "gradients held between micro-batches (DDP's no_sync, Megatron-LM's distributed optimizer, FSDP's "
            "no_sync); micro_batch, after every micro-batch into the gradient shard (DeepSpeed's ZeRO-2, FSDP's "
            "default; ZeRO 2 and 3); auto: step under ZeRO 0-1, micro_batch under ZeRO 2-3")},
       zero_axes,
       check_zero,
       "held per rank, N the ranks sharing the state (dp, or dp_shard), Psi_p = N x sum over units of "
       "ceil(unit / N): stage 1 8 Psi_p + 8 Psi_p / N, stage 2 4 Psi_p + 12 Psi_p / N, stage 3 16 Psi_p / N (mixed "
       "precision 4 + 12 / N, 2 + 14 / N, 16 / N; docs/costs.md), grad_sync step adding whole gradients (Psi_p) to "
       "stages 2-3; while in use, gathered units (stage 3) and reduce-scatter buffers (reducing every micro-batch, at "
       "most bucket_mb of them; whole gradients, their outputs, one shard in all, until the step's end); a "
       "reduce-scatter of the gradients per step (grad_sync step) or per micro-batch; hybrid sharding adds an "
       "all-reduce of each shard (Psi_p / N elements) over dp / dp_shard ranks a step",
       zero_parts,
       {{60, "parallel.zero", zero_stages, false, "zero"}, {70, "parallel.dp_shard", shard_sizes, false, "shard", "0"}}},
      [](const plan::Plan& p) { return p.parallel.zero > 0; },
      [](const StateConfig& cfg, const models::ParamRegistry& reg, std::vector<models::Unit> units,
         comm::Communicator* group, core::MemoryTracker& tracker) -> std::unique_ptr<StateStrategy> {
        return std::make_unique<Zero>(cfg, reg, std::move(units), group, tracker);
      },
      // Hybrid sharding named with its shard group's size.
      [](const plan::Plan& p) {
        const int s = p.parallel.dp_shard;
        return fmt::format("zero{}{}", p.parallel.zero, s != 0 && s != p.parallel.dp ? fmt::format(" hybrid {}", s) : "");
      }};
  return row;
}

using core::MemCategory;

Zero::Zero(const StateConfig& cfg, const models::ParamRegistry& reg, std::vector<models::Unit> units,
           comm::Communicator* dp, core::MemoryTracker& tracker)
    : stage_(cfg.zero), reg_(reg), units_(std::move(units)), dp_(dp),
      replica_(cfg.replica != nullptr && cfg.replica->size() > 1 ? cfg.replica : nullptr), tracker_(tracker),
      tp_size_(cfg.tp_size),
      precision_(cfg.precision), grad_precision_(cfg.grad_precision()), wide_grads_(tracker, units_.size()),
      bucket_bytes_(cfg.bucket_bytes), overlap_(cfg.overlap), every_micro_batch_(cfg.reduce_every_micro_batch) {
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
  if (stage_ <= 2)
    params_full_ = models::Flat(tracker, MemCategory::params, precision_, full, "parameters (padded)");
  else
    params_shard_ = models::Flat(tracker, MemCategory::params, precision_, shard, "parameter shard");
  // The keyed initial values: every unit whole (stages 1-2) or this rank's
  // block (stage 3), rounded when stored 16-bit.
  for (std::size_t u = 0; u < units_.size(); ++u) {
    const auto& s = us_[u];
    const std::int64_t lo = stage_ <= 2 ? units_[u].begin : s.own_begin, hi = stage_ <= 2 ? units_[u].end : s.own_end;
    params_store().load(stage_ <= 2 ? n_ * s.q : s.q, hi - lo, models::initial_values(reg_, cfg.seed, lo, hi).data());
  }
  if (whole_grads())
    grads_full_ = models::Flat(tracker, MemCategory::grads, grad_precision_, full, "gradients (padded)");
  if (stage_ >= 2)
    grads_shard_ = models::Flat(tracker, MemCategory::grads, grad_precision_, shard, "gradient shard");
  for (const auto& s : us_) {
    optimizers_.push_back(std::make_unique<models::AdamW>(reg_, s.own_begin, s.own_end, cfg.adamw, tracker, s.shard,
                                                          cfg.offload, precision_, grad_precision_));
    if (mixed())  // the padding stays zero
      optimizers_.back()->set_master(models::initial_values(reg_, cfg.seed, s.own_begin, s.own_end, s.shard).data());
  }
  unit_grads_.resize(units_.size());
  gathered_.resize(units_.size());
  if (replica_ != nullptr) replica_requests_.resize(units_.size());
  if (cfg.offload.params && cfg.offload.nvme != nullptr) {
    STRATA_CHECK(stage_ == 3, "parameter offload needs ZeRO stage 3, not {}", stage_);
    nvme_ = cfg.offload.nvme;
    stats_ = cfg.offload.stats;
    for (std::size_t u = 0; u < units_.size(); ++u) param_region_.push_back(nvme_->reserve_block(param_block_bytes(int(u))));
    params_in_memory(false);  // the initial values to the file
  }
}

void Zero::count_block_io(int u, double seconds, bool write) {
  if (stats_ == nullptr) return;
  (write ? stats_->nvme_bytes_written : stats_->nvme_bytes_read) +=
      double(models::NvmeFile::aligned_size(param_block_bytes(u)));
  stats_->nvme_io_time += seconds;
  stats_->nvme_wait_time += seconds;  // transferred when needed: nothing hides it
}

void Zero::read_params(int u, void* dst) {
  if (params_shard_.size() != 0)
    kernels::copy_bytes(dst, params_shard_.at(us_[u].q), std::size_t(param_block_bytes(u)));
  else
    count_block_io(u, nvme_->read_block(dst, param_block_bytes(u), param_region_[std::size_t(u)]), false);
}

void Zero::write_params(int u, const void* src) {
  if (params_shard_.size() != 0)
    kernels::copy_bytes(params_shard_.at(us_[u].q), src, std::size_t(param_block_bytes(u)));
  else
    count_block_io(u, nvme_->write_block(src, param_block_bytes(u), param_region_[std::size_t(u)]), true);
}

bool Zero::params_in_memory(bool on) {
  if (!params_on_nvme() || on == (params_shard_.size() != 0)) return false;
  if (on) {
    models::Flat shard(tracker_, MemCategory::params, precision_, std::size_t(shard_total_),
                       "parameter shard (read from NVMe)");
    for (std::size_t u = 0; u < us_.size(); ++u) read_params(int(u), shard.at(us_[u].q));
    params_shard_ = std::move(shard);
  } else {
    models::Flat shard = std::move(params_shard_);  // now empty: writes go to the file
    for (std::size_t u = 0; u < us_.size(); ++u) write_params(int(u), shard.at(us_[u].q));
  }
  return true;
}

Zero::~Zero() = default;

std::vector<models::AdamW*> Zero::optimizer_list() const {
  std::vector<models::AdamW*> out;
  for (const auto& o : optimizers_) out.push_back(o.get());
  return out;
}

std::int64_t Zero::own_params_index(int u) const {
  const auto& s = us_[u];
  return stage_ <= 2 ? n_ * s.q + r_ * s.shard : s.q;
}

std::int64_t Zero::own_grads_index(int u) const {
  const auto& s = us_[u];
  return stage_ == 1 ? n_ * s.q + r_ * s.shard : s.q;
}

void Zero::begin_step() {
  STRATA_CHECK(pending_.empty(), "reduce-scatters still in flight at the start of a step");
  grads_store().zero();
  if (whole_grads() && stage_ >= 2) grads_full_.zero();
}

void Zero::begin_micro_batch(bool last) {
  // Reducing every micro-batch (stages 2-3), the previous micro-batch's
  // reduce-scatters complete here (they overlapped the rest of its backward
  // pass, or start now without overlap): what is held never depends on when
  // a transfer happens to finish, and at most one micro-batch's unreduced
  // gradients (with overlap, at most parallel.bucket_mb of them) are held at
  // once. Whole gradients are reduced once, in the action that completes
  // each unit's: those calls are the step's last and are left to
  // finish_gradients, so a pipeline's later micro-batches (another chunk's,
  // under the interleaved schedule) never wait for them.
  if (!whole_grads()) {
    issue_held();
    while (!pending_.empty()) pop_front();
  }
  last_ = last;
}

core::CPtr Zero::acquire_params(int u) {
  models::Flat* whole = &params_full_;
  std::int64_t at = n_ * us_[u].q;
  if (stage_ > 2) {
    auto& g = gathered_[u];
    if (g.data.size() == 0) prefetch(u);
    if (g.request) {
      g.request->wait();
      g.request.reset();
    }
    g.source.reset();
    ++g.refs;
    whole = &g.data;
    at = 0;
  }
  return whole->ptr(at);
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
  g.data = models::Flat(tracker_, MemCategory::params, precision_, std::size_t(n_ * s.shard), "gathered unit");
  const void* mine = params_shard_.size() != 0 ? params_shard_.at(s.q) : nullptr;
  if (mine == nullptr) {  // offload.params: this rank's block from the file first
    g.source = models::Flat(tracker_, MemCategory::params, precision_, std::size_t(s.shard), "parameter block from NVMe");
    read_params(u, g.source.at(0));
    mine = g.source.at(0);
  }
  if (n_ > 1)
    g.request = dp_->iall_gather(mine, g.data.at(0), s.shard, g.data.dtype());
  else
    kernels::copy_bytes(g.data.at(0), mine, std::size_t(s.shard) * std::size_t(core::element_bytes(precision_)));
}

float* Zero::grads(int u) {
  // Stage 1 and 16-bit grads: padded to the unit's N blocks, so the
  // accumulator is exactly what the reduce-scatter takes.
  if (half_grads()) return wide_grads_.grads(u, n_ * us_[u].shard);
  if (whole_grads()) return grads_full_.f32(n_ * us_[u].q);
  auto& b = unit_grads_[u];
  if (b.size() == 0)  // the tracker hands out zeroed memory
    b = models::Flat(tracker_, MemCategory::comm, grad_precision_, std::size_t(n_ * us_[u].shard),
                     "unreduced unit gradients");
  return b.f32();
}

void Zero::launch_reduce_scatter(int u, models::Flat input, const void* src) {
  const auto& s = us_[u];
  Pending p{u, std::move(input),
            models::Flat(tracker_, MemCategory::comm, grad_precision_, std::size_t(s.shard), "reduce-scatter output"),
            nullptr, last_, src};
  in_flight_bytes_ += std::int64_t(p.input.bytes() + p.output.bytes());
  if (overlap_) issue(p);
  pending_.push_back(std::move(p));
}

void Zero::issue(Pending& p) {
  if (n_ > 1)
    p.request = dp_->ireduce_scatter(p.src, p.output.at(0), us_[p.unit].shard, p.output.dtype(), comm::ReduceOp::sum);
  else
    kernels::copy_bytes(p.output.at(0), p.src, p.output.bytes());
  p.issued = true;
}

void Zero::issue_held() {
  for (auto& p : pending_)
    if (!p.issued) issue(p);
}

void Zero::grads_done(int u) {
  const std::int64_t padded = n_ * us_[u].shard;
  if (whole_grads()) {
    // Stage 1 (and grad_sync = "step") keeps whole gradients through
    // accumulation and reduces once.
    if (const float* g = half_grads() ? wide_grads_.written(u) : nullptr) {
      kernels::add_inplace(grads_full_.ptr(n_ * us_[u].q), g, padded);
      wide_grads_.done(u);
    }
    if (last_) launch_reduce_scatter(u, models::Flat(), grads_full_.at(n_ * us_[u].q));
  } else {
    // Stages 2 and 3 reduce every micro-batch into the shard, so no rank
    // ever holds more than its shard between micro-batches. A split backward
    // may already have reduced this micro-batch's part with another's (its
    // input-gradient half wrote before the other's weight-gradient half said
    // done): nothing is left, and every dp rank, running the same schedule,
    // skips alike.
    models::Flat b;
    if (!half_grads()) {
      if (unit_grads_[u].size() == 0) return;
      b = std::move(unit_grads_[u]);
    } else {
      const float* g = wide_grads_.written(u);
      if (g == nullptr) return;
      b = models::Flat(tracker_, MemCategory::comm, grad_precision_, std::size_t(padded), "unreduced unit gradients");
      b.write(0, padded, g);
      wide_grads_.done(u);
    }
    const void* src = b.at(0);
    launch_reduce_scatter(u, std::move(b), src);
  }
  poll();
  // Bound the reduce-scatter buffers held at once, as DeepSpeed's reduce
  // bucket does: past parallel.bucket_mb, wait for the oldest reduce-scatters.
  // Buffers are freed only here, at the next micro-batch and at
  // finish_gradients, so what a step holds does not depend on when a
  // transfer happens to complete, and the dry run's estimate of it is exact.
  // Without overlap nothing is issued before the backward pass ends, so the
  // micro-batch's unreduced gradients are all held until then. Whole
  // gradients are reduced from the gradient buffer itself and their outputs
  // add up to one shard: nothing grows to bound, and, as with Megatron-LM's
  // distributed optimizer, the backward pass never waits for them.
  while (overlap_ && !whole_grads() && in_flight_bytes_ > bucket_bytes_ && pending_.size() > 1) pop_front();
}

void Zero::pop_front() {
  complete(pending_.front());
  in_flight_bytes_ -= std::int64_t(pending_.front().input.bytes() + pending_.front().output.bytes());
  pending_.erase(pending_.begin());
}

void Zero::complete(Pending& p) {
  if (p.request) p.request->wait();
  const auto& s = us_[p.unit];
  STRATA_CHECK(replica_ == nullptr || !replica_requests_[std::size_t(p.unit)],
               "unit {}'s gradients reduced after its replica all-reduce was launched", p.unit);
  if (stage_ == 1)
    kernels::copy_bytes(own_grads(p.unit), p.output.at(0), p.output.bytes());
  else
    grads_store().add(own_grads_index(p.unit), s.shard, p.output, 0);
  // The action that completes the unit's gradients launched this one: its
  // shard is final on this group, and its replicas can start summing (while
  // the backward pass goes on, reducing every micro-batch; whole gradients
  // complete at the step's end).
  if (replica_ != nullptr && p.last) launch_replica_all_reduce(p.unit);
}

void Zero::launch_replica_all_reduce(int u) {
  replica_requests_[std::size_t(u)] =
      replica_->iall_reduce(own_grads(u), us_[u].shard, grads_store().dtype(), comm::ReduceOp::sum);
}

void Zero::poll() {
  // MPICH progresses only inside MPI calls. Completion (the sum into the
  // shard and freeing the buffers) waits for pop_front, in launch order, so
  // the sums are the same whatever the timing.
  for (auto& p : pending_)
    if (p.request) p.request->test();
  for (auto& r : replica_requests_)
    if (r) r->test();
}

void Zero::finish_gradients() {
  issue_held();
  while (!pending_.empty()) pop_front();
  if (replica_ == nullptr) return;
  // Hybrid sharding: each shard group has reduced its own ranks' gradients
  // into its shards, and the ranks holding the same shard in the other
  // groups sum theirs, once per step and in place (no buffer). Most units'
  // sums were launched as their last reduce-scatter completed; the rest
  // (a split backward's units, whose last reduction is not known before the
  // step ends) start here.
  for (std::size_t u = 0; u < us_.size(); ++u)
    if (!replica_requests_[u]) launch_replica_all_reduce(int(u));
  for (auto& r : replica_requests_) {
    r->wait();
    r.reset();
  }
}

double Zero::grad_norm_sq() {
  double sq = 0;
  for (std::size_t u = 0; u < us_.size(); ++u)
    sq += models::grad_sum_squares(reg_, own_grads(int(u)), us_[u].own_begin, us_[u].own_end, tp_size_,
                                   grad_precision_);
  if (n_ > 1) dp_->all_reduce(&sq, 1, comm::DType::f64, comm::ReduceOp::sum);
  return sq;
}

void Zero::update(float coef, float lr, int step) {
  // One optimizer per unit shard. With offload, the next shard's copy to
  // the host runs while this one updates, and the copies back while later
  // ones do; all are done before the parameters are used again.
  std::vector<std::size_t> owned;
  for (std::size_t u = 0; u < us_.size(); ++u)
    if (us_[u].own_end > us_[u].own_begin) owned.push_back(u);
  if (params_on_nvme() && params_shard_.size() == 0) {
    // offload.params: each block from the file, updated, and back.
    for (std::size_t u : owned) {
      models::Flat p(tracker_, MemCategory::params, precision_, std::size_t(us_[u].shard), "parameter block from NVMe");
      read_params(int(u), p.at(0));
      optimizers_[u]->update(p.at(0), own_grads(int(u)), coef, lr, step);
      optimizers_[u]->finish();
      write_params(int(u), p.at(0));
    }
    return;
  }
  for (std::size_t i = 0; i < owned.size(); ++i) {
    if (i + 1 < owned.size()) {
      const int next = int(owned[i + 1]);
      optimizers_[std::size_t(next)]->stage(own_params(next), own_grads(next));
    }
    const int u = int(owned[i]);
    optimizers_[std::size_t(u)]->update(own_params(u), own_grads(u), coef, lr, step);
  }
  for (std::size_t u : owned) optimizers_[u]->finish();
  if (stage_ <= 2 && n_ > 1) {
    // Every rank's updated block back into everyone's replicated parameters.
    std::vector<comm::RequestPtr> reqs;
    for (std::size_t u = 0; u < us_.size(); ++u)
      reqs.push_back(dp_->iall_gather(own_params(int(u)), params_full_.at(n_ * us_[u].q), us_[u].shard,
                                      params_full_.dtype()));
    for (auto& r : reqs) r->wait();
  }
}

std::vector<float> Zero::gather_unit(int u, const float* mine) {
  // On the host (a checkpoint's or a parity check's copy): this rank's
  // block comes off the device first.
  const auto& s = us_[u];
  std::vector<float> own = models::to_host(mine, s.shard);
  if (n_ == 1) return own;
  std::vector<float> all(std::size_t(n_ * s.shard));
  dp_->all_gather(own.data(), all.data(), s.shard, comm::DType::f32);
  return all;
}

std::vector<float> Zero::full_params() {
  // Mixed precision: the master weights, each rank's block of every unit.
  const models::StateInMemory held(optimizer_list());
  const bool brought = params_in_memory(true);
  std::vector<float> out(std::size_t(reg_.numel()));
  for (std::size_t u = 0; u < us_.size(); ++u) {
    const auto& s = us_[u];
    std::vector<float> gathered;
    if (mixed())
      gathered = gather_unit(int(u), optimizers_[u]->master());
    else if (stage_ > 2)
      gathered = gather_unit(int(u), params_shard_.f32(s.q));
    if (gathered.empty())
      kernels::copy_bytes(out.data() + units_[u].begin, params_full_.f32(n_ * s.q), sizeof(float) * std::size_t(s.size));
    else
      std::copy(gathered.begin(), gathered.begin() + s.size, out.begin() + units_[u].begin);
  }
  if (brought) params_in_memory(false);
  return out;
}

std::vector<StateTensor> Zero::state_tensors() {
  // Stages 1-2 hold every parameter (the padded full buffer), stage 3 its
  // shard; the moments (and master weights) are per unit shard.
  models::Flat& p = params_store();
  STRATA_CHECK(p.size() != 0, "state tensors of an NVMe-offloaded parameter shard: hold_state_in_memory first");
  std::vector<StateTensor> out{{"params", p.at(0), std::int64_t(p.size()), core::element_bytes(precision_)}};
  for (std::size_t u = 0; u < optimizers_.size(); ++u) {
    auto& o = *optimizers_[u];
    const std::string unit = "unit" + std::to_string(u);
    out.push_back({unit + ".adam_m", o.m(), o.capacity()});
    out.push_back({unit + ".adam_v", o.v(), o.capacity()});
    if (mixed()) out.push_back({unit + ".master", o.master(), o.capacity()});
  }
  return out;
}

FullState Zero::full_state() {
  const models::StateInMemory held(optimizer_list());
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
  const models::StateInMemory held(optimizer_list());
  const bool brought = params_in_memory(true);
  // In mixed precision the 16-bit parameters are the master weights rounded.
  for (std::size_t u = 0; u < us_.size(); ++u) {
    const auto& s = us_[u];
    if (stage_ <= 2)
      params_full_.load(n_ * s.q, s.size, st.params.data() + units_[u].begin);
    else
      params_shard_.load(s.q, s.own_end - s.own_begin, st.params.data() + s.own_begin);
    const std::int64_t own = s.own_end - s.own_begin;
    if (mixed()) models::from_host(optimizers_[u]->master(), st.params.data() + s.own_begin, own);
    models::from_host(optimizers_[u]->m(), st.m.data() + s.own_begin, own);
    models::from_host(optimizers_[u]->v(), st.v.data() + s.own_begin, own);
  }
  if (brought) params_in_memory(false);
}

}  // namespace strata::strategies
