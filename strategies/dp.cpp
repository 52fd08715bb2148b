#include "strategies/dp.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "kernels/kernels.hpp"
#include "models/model.hpp"
#include "models/state.hpp"
#include "plan/plan.hpp"
#include "strategies/registry.hpp"

namespace strata::strategies {

namespace {

// Each data-parallel rank takes global_batch / dp sequences of a step, in
// whole micro-batches (every state strategy works over the dp group).
constexpr std::int64_t kMaxBucketMib = std::int64_t(1) << 20;
constexpr int kMaxBuckets = 1024;

void check_dp(const plan::Plan& p, PlanChecks& checks) {
  // The bucket sizes a buffer in bytes (64-bit: 2^20 MiB leaves room) and,
  // under dp, the count of all-reduces in flight each step: one request each,
  // which the MPI library polls in turn, so that thousands of tiny buckets
  // cost time and memory without bound (and a bucket under one gradient
  // would be one call per gradient).
  const double bucket_mb = p.parallel.bucket_mb;
  if (bucket_mb > double(kMaxBucketMib))
    checks.error({"parallel.bucket_mb"}, fmt::format("{} is more than {} MiB (1 TiB): no device holds a bucket that "
                                                     "large; a bucket past the gradients' size is one bucket",
                                                     checks.show("parallel.bucket_mb"), kMaxBucketMib));
  else if (p.parallel.zero == 0 && p.parallel.dp > 1 && checks.sized()) {
    // Counted at 4 B a gradient (the most buckets any precision makes), over
    // the parameters a rank of one tp and pp position holds on average.
    const long double per_rank = models::family(p).parameters(p) / p.parallel.tp / p.parallel.pp;
    const long double per_bucket = std::max(1.0L, std::floor((long double)bucket_mb * (1 << 20) / 4));
    const long double buckets = std::ceil(per_rank / per_bucket);
    if (buckets > kMaxBuckets)
      checks.error({"parallel.bucket_mb", "parallel.dp"},
                   fmt::format("{} cuts a rank's {:.0f} gradients into {:.3g} buckets, an all-reduce each per step "
                               "under {}; at most {}: a bucket of at least {:.3g} MiB",
                               checks.show("parallel.bucket_mb"), double(per_rank), double(buckets),
                               checks.show("parallel.dp"), kMaxBuckets,
                               double(per_rank * 4 / kMaxBuckets / (1 << 20))));
  }
  const auto& d = p.data;
  if (d.global_batch % d.micro_batch == 0 && d.global_batch % (d.micro_batch * p.parallel.dp) != 0)
    checks.error({"data.global_batch", "data.micro_batch", "parallel.dp"},
                 fmt::format("{} is not a multiple of {} x {}: each data-parallel rank takes global_batch / dp "
                             "sequences in whole micro-batches",
                             checks.show("data.global_batch"), checks.show("parallel.dp"),
                             checks.show("data.micro_batch")));
}

std::unique_ptr<StateStrategy> make_dp(const StateConfig& cfg, const models::ParamRegistry& reg,
                                       std::vector<models::Unit> units, comm::Communicator* group,
                                       core::MemoryTracker& tracker) {
  return std::make_unique<DataParallel>(cfg, reg, std::move(units), group, tracker);
}

// The dp dim and its group, which every state strategy works over (ZeRO's
// hybrid sharding and expert parallelism cut it).
void dp_axes(const plan::Plan& p, mesh::Layout& l) {
  mesh::add_dim(l, {.name = "dp", .size = p.parallel.dp, .nest = 200, .doc = "data-parallel index"});
  mesh::add_group(l, {.name = "dp", .dims = {"dp"}, .doc = "the data-parallel replicas: the gradient reduction"});
}

void dp_parts(const plan::Plan&, const MeshGroups& mesh, Parallel& out) {
  out.data = several(mesh.group("dp"));
  out.same_params = out.data;
}

// The devices the other dims leave, when each then takes whole sequences.
std::vector<std::string> dp_sizes(const Space& s, const plan::Plan& p) {
  const int dp = devices_left(s, p);
  if (dp == 0 || p.data.global_batch % dp != 0) return {};
  return {std::to_string(dp)};
}

}  // namespace

const StateRow& data_parallel_row() {
  using plan::key, plan::Plan, plan::ParallelSection;
  static const StateRow row{
      {"dp", "replicated parameters, gradients and optimizer state; gradient buckets all-reduced during the backward pass",
       {key<&Plan::parallel, &ParallelSection::dp>("parallel", "dp", "data-parallel replicas").at_least(1),
        key<&Plan::parallel, &ParallelSection::bucket_mb>(
            "parallel", "bucket_mb",
            "gradient bucket, MiB: dp all-reduces each as soon as it is complete; ZeRO reducing every micro-batch "
            "holds at most this much in reduce-scatter buffers (one more while it waits); at most 1048576 (1 TiB), "
            "and under dp at most 1024 buckets a step")
            .above(0),
        key<&Plan::parallel, &ParallelSection::overlap_grad_reduce>(
            "parallel", "overlap_grad_reduce",
            "reduce gradients during the backward pass, each bucket (ZeRO: each unit) as soon as it is complete; "
            "false: all of them after the backward pass, as Megatron-LM without --overlap-grad-reduce"),
        key<&Plan::parallel, &ParallelSection::grad_reduce>(
            "parallel", "grad_reduce",
            "under bf16 or fp16, the precision gradients are accumulated over micro-batches, held and reduced over "
            "ranks in (dp's all-reduces, ZeRO's reduce-scatters): compute, the 16-bit format (DeepSpeed's and "
            "FSDP's default); fp32, 4 bytes a gradient (Megatron-LM's default under bf16)")},
       dp_axes,
       check_dp,
       "params 4 Psi, grads 4 Psi, optimizer 8 Psi (mixed precision 2 + 2 + 12 Psi, with grad_reduce fp32 "
       "2 + 4 + 12 Psi); all-reduce of the gradients' 4 Psi (2 Psi) per step, in buckets",
       dp_parts,
       {{40, "parallel.dp", dp_sizes, false, "dp"}}},
      [](const plan::Plan& p) { return p.parallel.zero == 0; },
      make_dp,
      [](const plan::Plan&) { return std::string("dp"); }};
  return row;
}

DataParallel::DataParallel(const StateConfig& cfg, const models::ParamRegistry& reg, std::vector<models::Unit> units,
                           comm::Communicator* dp, core::MemoryTracker& tracker)
    : models::ReplicatedState(reg, std::move(units), tracker, cfg.seed, cfg.precision, cfg.grad_precision()), reg_(reg),
      tp_size_(cfg.tp_size), dp_(dp != nullptr && dp->size() > 1 ? dp : nullptr), overlap_(cfg.overlap),
      optimizer_(reg, 0, reg.numel(), cfg.adamw, tracker, -1, cfg.offload, cfg.precision, cfg.grad_precision()) {
  const std::int64_t n = numel();
  if (optimizer_.mixed()) optimizer_.set_master(models::initial_values(reg, cfg.seed, 0, n).data());
  const std::int64_t per =
      std::max<std::int64_t>(1, cfg.bucket_bytes / core::element_bytes(cfg.grad_precision()));
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
    in_flight_.push_back(dp_->iall_reduce(grads_.at(b.begin), b.end - b.begin, grads_.dtype(), comm::ReduceOp::sum));
  }
  // MPICH progresses non-blocking collectives only inside MPI calls: poll.
  for (auto& r : in_flight_) r->test();
}

void DataParallel::grads_done(int unit) {
  models::ReplicatedState::grads_done(unit);  // 16-bit: the fp32 accumulator into the store
  // Units complete from the last to the first, so everything at or above this
  // unit's first element is final.
  if (dp_ != nullptr && last_ && overlap_) launch_ready(units_[unit].begin);
}

void DataParallel::finish_gradients() {
  if (dp_ == nullptr) return;
  launch_ready(0);
  for (auto& r : in_flight_) r->wait();
  in_flight_.clear();
}

double DataParallel::grad_norm_sq() {
  return models::grad_sum_squares(reg_, grads_.at(0), 0, numel(), tp_size_, grads_.precision());
}

void DataParallel::update(float coef, float lr, int step) {
  optimizer_.update(params_.at(0), grads_.at(0), coef, lr, step);
  optimizer_.finish();  // one range: nothing to overlap its copies with
}

std::vector<float> DataParallel::full_params() {
  const models::StateInMemory held(std::vector<models::AdamW*>{&optimizer_});
  return models::to_host(optimizer_.mixed() ? optimizer_.master() : params_.f32(), numel());
}

FullState DataParallel::full_state() {
  const models::StateInMemory held(std::vector<models::AdamW*>{&optimizer_});
  return {full_params(), models::to_host(optimizer_.m(), numel()), models::to_host(optimizer_.v(), numel())};
}

void DataParallel::set_full_state(const FullState& s) {
  const models::StateInMemory held(std::vector<models::AdamW*>{&optimizer_});
  // In mixed precision the 16-bit parameters are the master weights rounded.
  params_.load(0, numel(), s.params.data());
  if (optimizer_.mixed()) models::from_host(optimizer_.master(), s.params.data(), numel());
  models::from_host(optimizer_.m(), s.m.data(), numel());
  models::from_host(optimizer_.v(), s.v.data(), numel());
}

std::vector<StateTensor> DataParallel::state_tensors() {
  std::vector<StateTensor> out{{"params", params_.at(0), numel(), core::element_bytes(params_.precision())},
                               {"adam_m", optimizer_.m(), optimizer_.capacity()},
                               {"adam_v", optimizer_.v(), optimizer_.capacity()}};
  if (optimizer_.mixed()) out.push_back({"master", optimizer_.master(), optimizer_.capacity()});
  return out;
}

}  // namespace strata::strategies
