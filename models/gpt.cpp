// GPT forward and backward over one micro-batch. The residual stream of block
// l is res3[l-1] (or the embedding output for l = 0); the backward pass keeps
// a single running residual gradient `dres_` that every branch accumulates
// into, as the kernels' += convention allows.
#include "models/gpt.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/kernels.hpp"
#include "models/init.hpp"
#include "models/linear.hpp"
#include "kernels/foundation/error.hpp"

namespace strata::models {

using core::MemCategory;
using prof::Phase;
using prof::ScopedSpan;

static std::string lname(int l, const char* what) { return "h." + std::to_string(l) + "." + what; }

std::vector<int> stage_block_counts(int layers, int stages, int first, int last) {
  STRATA_CHECK(stages >= 1, "{} pipeline stages", stages);
  if (stages == 1) return {layers};
  const int fixed = (first >= 0) + (last >= 0), rest = layers - std::max(first, 0) - std::max(last, 0);
  const int others = stages - fixed;
  STRATA_CHECK(rest >= 0 && (others == 0 ? rest == 0 : rest % others == 0 && rest / others >= 1),
               "{} layers over {} stages (first {}, last {}): the other stages do not get the same number, at least 1",
               layers, stages, first, last);
  std::vector<int> n(std::size_t(stages), others > 0 ? rest / others : 0);
  if (first >= 0) n.front() = first;
  if (last >= 0) n.back() = last;
  return n;
}

GptStage gpt_stage(const GptConfig& c, int index, int count, int first, int last) {
  const std::vector<int> n = stage_block_counts(c.layers, count, first, last);
  int begin = 0;
  for (int s = 0; s < index; ++s) begin += n[std::size_t(s)];
  return GptStage{begin, begin + n[std::size_t(index)], index == 0, index == count - 1};
}

static GptStage resolved(const GptConfig& c, GptStage s) {
  if (s.last < 0) s.last = c.layers;
  return s;
}

ParamRegistry gpt_registry(const GptConfig& c, int tp_size, int tp_rank, GptStage stage, int ep_size, int ep_rank) {
  stage = resolved(c, stage);
  const std::int64_t C = c.d_model, F = c.ffn(), V = c.vocab, T = c.seq_len;
  // GPT-2's initialisation: N(0, 0.02) for matrices, the residual output
  // projections scaled by 1/sqrt(2 L) so the stream's variance stays bounded.
  const float std = 0.02f, res_std = 0.02f / std::sqrt(2.0f * float(c.layers));
  // Megatron's split: the embedding by vocabulary rows; QKV (three sections)
  // and the first MLP linear by output rows (column-parallel); the two output
  // projections by input columns (row-parallel). Norms and the row-parallel
  // biases are whole on every rank.
  const Slice rows{0, 1, tp_size, tp_rank}, qkv_rows{0, 3, tp_size, tp_rank}, cols{1, 1, tp_size, tp_rank};
  ParamRegistry r;
  if (stage.embedding) {
    r.add("wte", {V, C}, Init::normal, std, true, rows);
    r.add("wpe", {T, C}, Init::normal, std, true);
  }
  for (int l = stage.first; l < stage.last; ++l) {
    r.add(lname(l, "ln1.weight"), {C}, Init::ones, 0, false);
    r.add(lname(l, "ln1.bias"), {C}, Init::zeros, 0, false);
    r.add(lname(l, "attn.qkv.weight"), {3 * C, C}, Init::normal, std, true, qkv_rows);
    r.add(lname(l, "attn.qkv.bias"), {3 * C}, Init::zeros, 0, false, qkv_rows);
    r.add(lname(l, "attn.proj.weight"), {C, C}, Init::normal, res_std, true, cols);
    r.add(lname(l, "attn.proj.bias"), {C}, Init::zeros, 0, false);
    r.add(lname(l, "ln2.weight"), {C}, Init::ones, 0, false);
    r.add(lname(l, "ln2.bias"), {C}, Init::zeros, 0, false);
    if (c.is_moe(l)) {
      // The router (replicated), then the experts' MLPs stacked expert after
      // expert, each initialised as the dense MLP is: whole on every
      // tensor-parallel rank, split by experts over the expert-parallel ranks.
      const std::int64_t E = c.moe.experts;
      const Slice experts{0, 1, ep_size, ep_rank};
      r.add(lname(l, "moe.router.weight"), {E, C}, Init::normal, std, true);
      r.mark_expert(r.add(lname(l, "moe.experts.fc.weight"), {E, F, C}, Init::normal, std, true), experts);
      r.mark_expert(r.add(lname(l, "moe.experts.fc.bias"), {E, F}, Init::zeros, 0, false), experts);
      r.mark_expert(r.add(lname(l, "moe.experts.proj.weight"), {E, C, F}, Init::normal, res_std, true), experts);
      r.mark_expert(r.add(lname(l, "moe.experts.proj.bias"), {E, C}, Init::zeros, 0, false), experts);
      continue;
    }
    r.add(lname(l, "mlp.fc.weight"), {F, C}, Init::normal, std, true, rows);
    r.add(lname(l, "mlp.fc.bias"), {F}, Init::zeros, 0, false, rows);
    r.add(lname(l, "mlp.proj.weight"), {C, F}, Init::normal, res_std, true, cols);
    r.add(lname(l, "mlp.proj.bias"), {C}, Init::zeros, 0, false);
  }
  if (stage.head) {
    r.add("lnf.weight", {C}, Init::ones, 0, false);
    r.add("lnf.bias", {C}, Init::zeros, 0, false);
    if (!stage.embedding) {
      const int i = r.add("wte", {V, C}, Init::normal, std, true, rows);  // the tied copy
      r.mark_tied_copy(i);
    }
  }
  return r;
}

long double gpt_param_count(const GptConfig& c) {
  using R = long double;
  const R C = c.d_model, F = R(c.ffn_mult) * c.d_model, V = c.vocab, T = c.seq_len, E = c.moe.experts;
  const R moe_layers = c.moe.experts > 0 ? R(c.layers / c.moe.every) : 0, dense_layers = R(c.layers) - moe_layers;
  // As gpt_registry lays them out: norms 4C, attention 4C^2 + 4C, and the
  // MLP (2FC + F + C), or the router EC and E experts' MLPs.
  const R attention = 4 * C + 4 * C * C + 4 * C, mlp = 2 * F * C + F + C;
  return V * C + T * C + dense_layers * (attention + mlp) + moe_layers * (attention + E * C + E * mlp) + 2 * C;
}

std::vector<BufferPlan> gpt_activation_plan(const GptConfig& c, int B, int tp, bool sp, GptStage stage,
                                            bool split_backward, const ContextSeam& cp) {
  stage = resolved(c, stage);
  // Per tensor-parallel rank: heads, hidden units and vocabulary are 1/tp;
  // with sequence parallelism the residual stream and norm statistics hold
  // 1/tp of the rows (the norm outputs are kept gathered, for the weight
  // gradients of the linears that read them).
  // "encoded" is the stage's input: the embedding's output, or the previous
  // stage's activations; a stage without the head has no head buffers.
  // T: this rank's tokens of each sequence (all of them without context
  // parallelism).
  const std::int64_t L = stage.last - stage.first, C = c.d_model, F = c.ffn() / tp, T = c.seq_len / cp.size(),
                     NH = c.heads / tp, Ct = c.d_model / tp;
  // Recomputation keeps one block's worth of what it rebuilds (at least one
  // block on the stage): full, every per-block buffer but the block outputs;
  // selective, the attention probabilities.
  const std::int64_t Lr = c.recompute == Recompute::full ? std::min<std::int64_t>(L, 1) : L;
  const std::int64_t La = c.recompute == Recompute::none ? L : std::min<std::int64_t>(L, 1);
  // The dense MLP's hidden activations exist for dense blocks only (a MoE
  // layer holds its experts' own).
  std::int64_t Ld = 0;
  for (int l = stage.first; l < stage.last; ++l) Ld += c.is_moe(l) ? 0 : 1;
  const std::int64_t Ldr = c.recompute == Recompute::full ? std::min<std::int64_t>(Ld, 1) : Ld;
  const std::int64_t V = stage.head ? c.vocab / tp : 0, H = stage.head ? 1 : 0;
  const std::int64_t N = B * T, Nl = sp ? N / tp : N;
  const std::int64_t att = cp.state_floats(c.fused_attention, int(B), int(NH), int(T), int(Ct));
  const std::int64_t datt = cp.scratch_floats(c.fused_attention, int(B), int(NH), int(T), int(Ct));
  const auto A = MemCategory::activations, W = MemCategory::workspace;
  std::vector<BufferPlan> plan = {
      {"encoded", Nl * C, A},
      {"ln1", Lr * N * C, A},
      {"ln1_mean", Lr * Nl, A},
      {"ln1_rstd", Lr * Nl, A},
      {"qkv", Lr * N * 3 * Ct, A},
      {"atty", Lr * N * Ct, A},
      {"att", La * att, A},  // the probabilities, or (fused) the rows' log-sum-exp
      {"res2", Lr * Nl * C, A},
      {"ln2", Lr * N * C, A},
      {"ln2_mean", Lr * Nl, A},
      {"ln2_rstd", Lr * Nl, A},
      {"fch", Ldr * N * F, A},
      {"fch_gelu", Ldr * N * F, A},
      {"res3", L * Nl * C, A},
      {"lnf", H * N * C, A},
      {"lnf_mean", H * Nl, A},
      {"lnf_rstd", H * Nl, A},
      {"logits", N * V, A},  // this rank's vocabulary columns; overwritten in place by dlogits
      {"losses", H * N, A},
      {"ce_max", H * N, A},  // row maximum, sum of exponentials and target logit over the whole vocabulary
      {"ce_sum", H * N, A},
      {"ce_target", H * N, A},
      {"dres", Nl * C, W},
      {"dbuf", N * C, W},
      {"dqkv", N * 3 * Ct, W},
      {"dprobs", datt, W},
      {"dfch", N * F, W},
      {"dgelu", N * F, W},
  };
  // The gradients of the block's replicated parameters from this rank's
  // rows (norms and row-parallel biases), summed over ranks where the rows
  // are split, then added to the parameters' gradients.
  plan.push_back({"rep_grads", 6 * C, W});
  if (sp) {
    plan.push_back({"sp_rows", Nl * C, W});
    plan.push_back({"dres_full", N * C, W});
  }
  if (split_backward) {
    // Kept from a micro-batch's input-gradient pass to its weight-gradient
    // pass, like activations (the head's output gradient stays in logits).
    plan.push_back({"dy_fcproj", Ld * N * C, A});
    plan.push_back({"dy_fc", Ld * N * F, A});
    plan.push_back({"dy_proj", L * N * C, A});
    plan.push_back({"dy_qkv", L * N * 3 * Ct, A});
  }
  return plan;
}

std::vector<BufferPlan> gpt_moe_plan(const GptConfig& c, int B, GptStage stage, int cp_size) {
  stage = resolved(c, stage);
  std::vector<BufferPlan> plan;
  for (int l = stage.first; l < stage.last; ++l)
    if (c.is_moe(l))
      for (auto& b : moe_buffer_plan(c.moe_layer(), B * (c.seq_len / cp_size))) plan.push_back(std::move(b));
  return plan;
}

std::vector<double> gpt_forward_flops(const GptConfig& c, int B) {
  const double C = c.d_model, F = c.ffn(), V = c.vocab, T = c.seq_len, N = double(B) * T;
  std::vector<double> f(c.layers + 2, 0.0);
  for (int l = 0; l < c.layers; ++l) {
    f[l + 1] = 2 * N * C * 3 * C     // qkv
               + 2 * N * T * C * 2   // q k^T and probs v, all heads
               + 2 * N * C * C;      // attention output projection
    // The MLP's two linears; a MoE block runs top_k experts per token (as
    // routed, before any dropping) and its router.
    f[l + 1] += c.is_moe(l) ? 2 * N * C * F * 2 * c.moe.top_k + 2 * N * C * c.moe.experts : 2 * N * C * F * 2;
  }
  f[c.layers + 1] = 2 * N * C * V;  // logits
  return f;
}

double gpt_model_flops(const GptConfig& c, int B) {
  double sum = 0;
  for (double x : gpt_forward_flops(c, B)) sum += x;
  return 3.0 * sum;  // backward = 2x forward (input and weight gradients)
}

double gpt_hardware_flops(const GptConfig& c, int B) {
  const double C = c.d_model, F = c.ffn(), T = c.seq_len, N = double(B) * T;
  double again = 0;
  for (int l = 0; l < c.layers; ++l) {
    const double attention_core = 2 * N * T * C * 2;
    if (c.recompute == Recompute::selective) again += attention_core;
    if (c.recompute == Recompute::full)
      again += 2 * N * C * 3 * C + attention_core + 2 * N * C * C + (c.is_moe(l) ? 0 : 2 * N * C * F);
  }
  return gpt_model_flops(c, B) + again;
}

std::vector<Unit> gpt_units(const ParamRegistry& reg, const GptConfig& c, GptStage stage) {
  stage = resolved(c, stage);
  std::vector<Unit> u;
  // wte is a unit of its own on both stages that hold it, so that the two
  // copies are sharded alike and their gradients can be summed shard by shard.
  auto whole = [&](const char* name) { return Unit{reg.find(name).offset, reg.find(name).offset + reg.find(name).numel}; };
  if (stage.embedding) {
    u.push_back(whole("wte"));
    u.push_back(whole("wpe"));
  }
  // A MoE block is two units: its attention, norms and router, then its
  // experts, whose gradients are synchronised over another group.
  for (int l = stage.first; l < stage.last; ++l) {
    const auto& first = reg.find(lname(l, "ln1.weight"));
    const auto& last = reg.find(lname(l, c.is_moe(l) ? "moe.router.weight" : "mlp.proj.bias"));
    u.push_back({first.offset, last.offset + last.numel});
    if (c.is_moe(l)) {
      const auto& e0 = reg.find(lname(l, "moe.experts.fc.weight"));
      const auto& e1 = reg.find(lname(l, "moe.experts.proj.bias"));
      u.push_back({e0.offset, e1.offset + e1.numel});
    }
  }
  if (stage.head) {
    u.push_back({reg.find("lnf.weight").offset, reg.find("lnf.bias").offset + reg.find("lnf.bias").numel});
    if (!stage.embedding) u.push_back(whole("wte"));
  }
  return u;
}

Gpt::Gpt(const GptConfig& config, int micro_batch, core::MemoryTracker& tracker, TensorSeam& tp, GptStage stage,
         bool split_backward, ExpertSeam& ep, ContextSeam& cp)
    : c_(config), B_(micro_batch), tp_(&tp), cp_(&cp), T_(config.seq_len / cp.size()), stage_(resolved(config, stage)),
      reg_(gpt_registry(config, tp.size(), tp.rank(), stage_, ep.size(), ep.rank())), split_(split_backward) {
  STRATA_CHECK(c_.d_model % c_.heads == 0, "d_model {} % heads {}", c_.d_model, c_.heads);
  STRATA_CHECK(kernels::is_meta() || c_.fused_attention == (kernels::device() == kernels::Device::cuda),
               "a model with {} attention on the {} backend", c_.fused_attention ? "fused" : "unfused",
               kernels::device_name(kernels::device()));
  STRATA_CHECK(!split_ || c_.recompute == Recompute::none, "a split backward keeps activations recomputation shares");
  STRATA_CHECK(c_.heads % tp_->size() == 0 && c_.vocab % tp_->size() == 0, "heads {} and vocab {} over tp {}",
               c_.heads, c_.vocab, tp_->size());
  STRATA_CHECK(c_.seq_len % cp_->size() == 0, "seq_len {} over cp {}", c_.seq_len, cp_->size());
  const std::int64_t N = std::int64_t(B_) * T_;
  Nl_ = tp_->rows(N);
  r0_ = tp_->first_row(N);
  units_ = gpt_units(reg_, c_, stage_);
  blocks_ = stage_.last - stage_.first;
  static const char* kDense[kParamsPerLayer] = {
      "ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
      "ln2.weight", "ln2.bias", "mlp.fc.weight",   "mlp.fc.bias",   "mlp.proj.weight",  "mlp.proj.bias", nullptr};
  static const char* kMoe[kParamsPerLayer] = {
      "ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
      "ln2.weight", "ln2.bias", "moe.experts.fc.weight", "moe.experts.fc.bias", "moe.experts.proj.weight",
      "moe.experts.proj.bias", "moe.router.weight"};
  int unit = stage_.embedding ? 2 : 0, dense_blocks = 0;
  for (int lb = 0; lb < blocks_; ++lb) {
    const int l = stage_.first + lb;
    const bool moe = c_.is_moe(l);
    block_unit_.push_back(unit++);
    expert_unit_.push_back(moe ? unit++ : -1);
    dense_index_.push_back(moe ? -1 : dense_blocks++);
    const char* const* names = moe ? kMoe : kDense;
    std::array<std::int64_t, kParamsPerLayer> o{};
    // Offsets within the parameter's unit: a MoE block's experts (8..11)
    // are in its expert unit.
    for (int k = 0; k < kParamsPerLayer; ++k) {
      const int u = moe && k >= 8 && k < 12 ? expert_unit_[std::size_t(lb)] : block_unit_[std::size_t(lb)];
      o[k] = names[k] == nullptr ? -1 : reg_.find(lname(l, names[k])).offset - units_[std::size_t(u)].begin;
    }
    layer_offsets_.push_back(o);
    if (moe) {
      moe_.push_back(std::make_unique<MoeLayer>(c_.moe_layer(), B_ * T_, tracker, ep));
    } else {
      moe_.push_back(nullptr);
    }
  }
  block_unit_.push_back(unit);  // the unit after the blocks
  if (stage_.head) {
    head_unit_ = unit;
    lnfw_off_ = reg_.find("lnf.weight").offset - units_[head_unit_].begin;
    lnfb_off_ = reg_.find("lnf.bias").offset - units_[head_unit_].begin;
    head_wte_unit_ = stage_.embedding ? kWteUnit : head_unit_ + 1;
  }

  plan_ = gpt_activation_plan(c_, B_, tp_->size(), Nl_ < N, stage_, split_, *cp_);
  for (const auto& p : plan_) acts_.emplace_back(tracker, p.category, p.numel, p.name);
  encoded_ = act("encoded");
  ln1_ = act("ln1"), ln1_mean_ = act("ln1_mean"), ln1_rstd_ = act("ln1_rstd");
  qkv_ = act("qkv"), atty_ = act("atty"), att_ = act("att"), res2_ = act("res2");
  ln2_ = act("ln2"), ln2_mean_ = act("ln2_mean"), ln2_rstd_ = act("ln2_rstd");
  fch_ = act("fch"), fch_gelu_ = act("fch_gelu"), res3_ = act("res3");
  lnf_ = act("lnf"), lnf_mean_ = act("lnf_mean"), lnf_rstd_ = act("lnf_rstd");
  logits_ = act("logits"), losses_ = act("losses");
  ce_max_ = act("ce_max"), ce_sum_ = act("ce_sum"), ce_target_ = act("ce_target");
  dres_ = act("dres"), dbuf_ = act("dbuf"), dqkv_ = act("dqkv"), dprobs_ = act("dprobs");
  dfch_ = act("dfch"), dgelu_ = act("dgelu");
  rep_grads_ = act("rep_grads");
  if (Nl_ < N) sp_rows_ = act("sp_rows"), dres_full_ = act("dres_full");
  if (split_) dy_fcproj_ = act("dy_fcproj"), dy_fc_ = act("dy_fc"), dy_proj_ = act("dy_proj"), dy_qkv_ = act("dy_qkv");
}

float* Gpt::act(const char* name) {
  for (std::size_t i = 0; i < plan_.size(); ++i)
    if (plan_[i].name == name) return acts_[i].data();
  core::runtime_error("no activation buffer '{}'", name);
}

void Gpt::finish_replicated(float* const* grads, int n) {
  const std::int64_t C = c_.d_model;
  tp_->reduce_replicated(rep_grads_, n * C);
  for (int k = 0; k < n; ++k) kernels::add_inplace(grads[k], rep_grads_ + k * C, C);
  kernels::fill_zero(rep_grads_, n * C);
}

const float* Gpt::output() const {
  return blocks_ == 0 ? encoded_ : res3_ + std::int64_t(blocks_ - 1) * Nl_ * c_.d_model;
}

Gpt::LayerParams Gpt::layer_view(float* base, float* experts, int l) const {
  const auto& o = layer_offsets_[l];
  float* mlp = experts != nullptr ? experts : base;
  return {base + o[0], base + o[1], base + o[2], base + o[3], base + o[4],  base + o[5],
          base + o[6], base + o[7], mlp + o[8],  mlp + o[9],  mlp + o[10], mlp + o[11],
          o[12] < 0 ? nullptr : base + o[12]};
}

namespace {

// Runs of rows whose positions are consecutive: rows [first, first + n) of
// the [B, T] local tokens (row = b T + t) at positions pos, pos + 1, ...
template <typename F>
void position_runs(const ContextSeam& cp, std::int64_t first, std::int64_t n, int T, int seq_len, F f) {
  std::int64_t row = first;
  while (row < first + n) {
    const int t = int(row % T), pos = cp.position(t, seq_len);
    std::int64_t len = 1;
    while (row + len < first + n && (row + len) % T != 0 && cp.position(t + int(len), seq_len) == pos + len) ++len;
    f(row - first, pos, len);
    row += len;
  }
}

}  // namespace

void Gpt::add_positions(float* rows, const float* wpe) {
  const int C = c_.d_model;
  if (cp_->size() == 1) {
    kernels::add_position_rows(rows, wpe, int(Nl_), C, T_, int(r0_));
    return;
  }
  position_runs(*cp_, r0_, Nl_, T_, c_.seq_len, [&](std::int64_t i, int pos, std::int64_t len) {
    kernels::add_inplace(rows + i * C, wpe + std::int64_t(pos) * C, len * C);
  });
}

void Gpt::position_grads(float* dwpe, const float* drows) {
  const int C = c_.d_model;
  position_runs(*cp_, 0, std::int64_t(B_) * T_, T_, c_.seq_len, [&](std::int64_t i, int pos, std::int64_t len) {
    kernels::add_inplace(dwpe + std::int64_t(pos) * C, drows + i * C, len * C);
  });
}

Gpt::BlockActs Gpt::block_acts(int lb) const {
  // Full recomputation keeps one block's worth (slot 0) and rebuilds it in
  // the backward pass; selective keeps every block's but one attention
  // probability matrix.
  const int B = B_, T = T_, C = c_.d_model, tp = tp_->size();
  const std::int64_t Ct = C / tp, Ft = c_.ffn() / tp, NHt = c_.heads / tp, N = std::int64_t(B) * T, Nl = Nl_;
  const std::int64_t k = c_.recompute == Recompute::full ? 0 : lb;
  const std::int64_t ka = c_.recompute == Recompute::none ? lb : 0;
  // The dense MLP's buffers, per dense block (a MoE block's point at the first, unused).
  const std::int64_t kd = c_.recompute == Recompute::full ? 0 : std::max(dense_index_[std::size_t(lb)], 0);
  return {ln1_ + k * N * C,  ln1_mean_ + k * Nl, ln1_rstd_ + k * Nl, qkv_ + k * N * 3 * Ct, atty_ + k * N * Ct,
          att_ + ka * cp_->state_floats(c_.fused_attention, B, int(NHt), T, int(Ct)), res2_ + k * Nl * C, ln2_ + k * N * C, ln2_mean_ + k * Nl,
          ln2_rstd_ + k * Nl, fch_ + kd * N * Ft, fch_gelu_ + kd * N * Ft};
}

void Gpt::norm_rows(float* out_all, float* mean, float* rstd, const float* x, const float* w, const float* b) {
  // A norm over this rank's rows [Nl, C], its output [N, C] of all rows for
  // the column-parallel linear that reads it (f, gathered in place).
  const int C = c_.d_model, N = B_ * T_;
  float* mine = out_all + r0_ * C;
  kernels::layernorm_forward(mine, mean, rstd, x, w, b, int(Nl_), C);
  tp_->gather(mine, out_all, N, C);
}

void Gpt::residual_rows(float* out, const float* x, const float* bias) {
  // out[Nl, C] = x + (this rank's rows of the row-parallel partial sums in
  // dbuf_ [N, C], summed over ranks: g) + bias.
  const int C = c_.d_model, N = B_ * T_;
  const float* sum = tp_->reduce(dbuf_, sp_rows_, N, C);
  kernels::residual_forward(out, x, sum, Nl_ * C);
  kernels::bias_add(out, bias, int(Nl_), C);
}

void Gpt::block_front(const BlockActs& a, const LayerParams& p, const float* x) {
  const int B = B_, T = T_, C = c_.d_model, tp = tp_->size(), N = B * T;
  const int Ct = C / tp, NHt = c_.heads / tp;
  norm_rows(a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1_w, p.ln1_b);
  linear_forward(a.qkv, a.ln1, p.qkv_w, p.qkv_b, N, C, 3 * Ct);  // column-parallel: this rank's heads
  // Over whole sequences: under context parallelism the ring brings the
  // other ranks' keys and values (the backward scratch holds them).
  cp_->attention_forward(a.atty, a.att, dprobs_, a.qkv, B, T, Ct, NHt);
  // Row-parallel output projection: partial sums over this rank's heads,
  // summed over the ranks (g), then the bias and the residual, once.
  linear_forward(dbuf_, a.atty, p.proj_w, nullptr, N, Ct, C);
  residual_rows(a.res2, x, p.proj_b);
  norm_rows(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2_w, p.ln2_b);
}

void Gpt::mlp_front(const BlockActs& a, const LayerParams& p) {
  const int N = B_ * T_, C = c_.d_model, Ft = c_.ffn() / tp_->size();
  linear_forward(a.fch, a.ln2, p.fc_w, p.fc_b, N, C, Ft);  // column-parallel
  kernels::gelu_forward(a.fch_gelu, a.fch, std::int64_t(N) * Ft);
}

float Gpt::forward(ParamState& st, const std::int32_t* tokens, const std::int32_t* targets, prof::Timeline* tl) {
  // Local sizes: this tensor-parallel rank's MLP hidden units (Ft) and
  // vocabulary rows [v0, v0 + Vt); its Nl rows of the residual stream start
  // at row r0 (all of them, from 0, unless sequence parallel).
  const int B = B_, T = T_, C = c_.d_model, L = c_.layers, tp = tp_->size();
  const int Ft = c_.ffn() / tp, Vt = c_.vocab / tp, v0 = tp_->rank() * Vt;
  const int N = B * T, Nl = int(Nl_);
  const std::int64_t NlC = std::int64_t(Nl) * C;
  if (stage_.embedding) {
    ScopedSpan s(tl, 0, Phase::forward);
    const float* wte = st.acquire_params(kWteUnit);
    const float* wpe = st.acquire_params(kWpeUnit);
    st.prefetch(block_unit(0));
    // Vocabulary-parallel: each rank looks up the rows it holds (a token
    // outside them gives 0), the sum over ranks is the lookup (g: this
    // rank's rows, in encoded_), then the whole position rows are added once.
    float* lookup = Nl == N ? encoded_ : dbuf_;  // [N, C]
    kernels::embedding_forward(lookup, tokens, wte, nullptr, B, T, C, v0, Vt);
    const float* sum = tp_->reduce(lookup, encoded_, N, C);
    STRATA_CHECK(sum == encoded_, "the embedding's sum outside the stage input");
    add_positions(encoded_, wpe);
    st.release_params(kWpeUnit);
    st.release_params(kWteUnit);
  }
  double aux = 0;  // the MoE blocks' auxiliary losses
  for (int lb = 0; lb < blocks_; ++lb) {
    const int l = stage_.first + lb;  // the global layer: timeline and names
    ScopedSpan s(tl, l + 1, Phase::forward);
    float* base = st.acquire_params(block_unit(lb));
    st.prefetch(block_unit(lb) + 1);  // a MoE block's experts, or the next block
    const int eu = expert_unit_[std::size_t(lb)];
    LayerParams p = layer_view(base, nullptr, lb);
    const float* x = lb == 0 ? encoded_ : res3_ + (lb - 1) * NlC;
    const BlockActs a = block_acts(lb);
    float* res3 = res3_ + lb * NlC;
    block_front(a, p, x);
    if (moe_[std::size_t(lb)]) {
      // Mixture of experts: the routed experts' outputs (their biases
      // included) added to the residual stream; the auxiliary loss joins
      // the training loss. Experts are whole on every tensor-parallel rank:
      // each runs the layer over all N rows (the norm gathered them under
      // sequence parallelism), so the output is complete, not a partial sum,
      // and a sequence-parallel rank keeps its own rows of it.
      p = layer_view(base, st.acquire_params(eu), lb);
      st.prefetch(eu + 1);
      aux += moe_[std::size_t(lb)]->forward(dbuf_, a.ln2, {p.router, p.fc_w, p.fc_b, p.fcproj_w, p.fcproj_b});
      kernels::residual_forward(res3, a.res2, dbuf_ + r0_ * C, NlC);
      st.release_params(eu);
    } else {
      mlp_front(a, p);
      linear_forward(dbuf_, a.fch_gelu, p.fcproj_w, nullptr, N, Ft, C);  // row-parallel
      residual_rows(res3, a.res2, p.fcproj_b);
    }
    st.release_params(block_unit(lb));
  }
  if (!stage_.head) return float(aux);
  ScopedSpan s(tl, L + 1, Phase::forward);
  // The head's units stay acquired until its backward, which comes next.
  float* uf = st.acquire_params(head_unit_);
  float* wte = st.acquire_params(head_wte_unit_);
  const float* xL = output();
  norm_rows(lnf_, lnf_mean_, lnf_rstd_, xL, uf + lnfw_off_, uf + lnfb_off_);
  linear_forward(logits_, lnf_, wte, nullptr, N, C, Vt);  // tied head: this rank's vocabulary columns
  // Vocabulary-parallel cross-entropy: the row maximum, the sum of
  // exponentials and the target's logit are combined over the ranks; no rank
  // holds the whole vocabulary's logits.
  kernels::row_max(ce_max_, logits_, N, Vt);
  tp_->all_reduce(ce_max_, N, comm::ReduceOp::max);
  kernels::row_exp_sum(ce_sum_, logits_, ce_max_, N, Vt);
  tp_->all_reduce(ce_sum_, N, comm::ReduceOp::sum);
  kernels::pick_target_logits(ce_target_, logits_, targets, v0, N, Vt);
  tp_->all_reduce(ce_target_, N, comm::ReduceOp::sum);
  kernels::cross_entropy_from_parts(losses_, ce_max_, ce_sum_, ce_target_, N);
  // The one read of device memory per micro-batch: the rows' losses.
  host_losses_.resize(std::size_t(N));
  kernels::copy_bytes(host_losses_.data(), losses_, sizeof(float) * std::size_t(N));
  double sum = 0;
  for (float x : host_losses_) sum += x;
  return float(sum / N + aux);
}

void Gpt::backward(ParamState& st, const std::int32_t* tokens, const std::int32_t* targets, float loss_scale,
                   prof::Timeline* tl, bool input_only) {
  STRATA_CHECK(!input_only || split_, "an input-only backward needs a model built with split_backward");
  const int B = B_, T = T_, C = c_.d_model, L = c_.layers, tp = tp_->size();
  const int Ct = C / tp, Ft = c_.ffn() / tp, Vt = c_.vocab / tp, NHt = c_.heads / tp, v0 = tp_->rank() * Vt;
  const int N = B * T, Nl = int(Nl_);
  const std::int64_t NC = std::int64_t(N) * C, NlC = std::int64_t(Nl) * C;
  const Phase phase = input_only ? Phase::backward_input : Phase::backward;
  // The residual gradient of all N rows [N, C], for the row-parallel
  // linears' input gradients (g backward: gathered where the rows are split).
  auto dres_all = [&] { return tp_->gather(dres_, dres_full_, N, C); };
  // A linear's output gradient `dy`: its input gradient now; its weight (and
  // bias) gradient now, or, input-only, a copy of dy kept in `keep` for
  // backward_weight() (nothing to copy when dy already is `keep`).
  auto linear_back = [&](float* dinp, float* dw, float* db, const float* dy, const float* inp, const float* w,
                         int IC, int OC, float* keep) {
    linear_backward_input(dinp, dy, w, N, IC, OC);
    if (!input_only)
      linear_backward_weight(dw, db, dy, inp, N, IC, OC);
    else if (keep != dy)
      kernels::copy_bytes(keep, dy, sizeof(float) * std::size_t(N) * std::size_t(OC));
  };
  // A norm's backward over this rank's rows, accumulating into dres_ [Nl, C],
  // from the column-parallel linears' partial input gradients [N, C] in dbuf_
  // (f backward: this rank's rows of their sum over ranks), or from a MoE
  // block's input gradient, which every rank holds whole (partial = false:
  // its own rows). Its weight and bias gradients are those of replicated
  // parameters from this rank's rows: into rep_grads_ + k*C and (k+1)*C, for
  // finish_replicated.
  auto norm_back = [&](const float* x, const float* w, const float* mean, const float* rstd, int k,
                       bool partial = true) {
    const float* d = partial ? tp_->reduce(dbuf_, sp_rows_, N, C) : dbuf_ + r0_ * C;
    kernels::layernorm_backward(dres_, rep_grads_ + std::int64_t(k) * C, rep_grads_ + std::int64_t(k + 1) * C, d, x,
                                w, mean, rstd, Nl, C);
  };
  // Without the head, output_grad() (dres_) already holds the gradient of
  // this stage's output.
  if (stage_.head) {
    ScopedSpan s(tl, L + 1, phase);
    // Acquired by the forward pass: these return the same pointers.
    float* uf = st.acquire_params(head_unit_);
    float* wte = st.acquire_params(head_wte_unit_);
    if (blocks_ > 0) st.prefetch(block_unit(blocks_ - 1));  // the last block's backward comes next
    float* gf = st.grads(head_unit_);
    float* dlogits = logits_;  // in place; kept there for backward_weight()
    kernels::softmax_cross_entropy_backward_sharded(dlogits, logits_, ce_max_, ce_sum_, targets, v0,
                                                    loss_scale / float(N), N, Vt);
    linear_back(dbuf_, input_only ? nullptr : st.grads(head_wte_unit_), nullptr, dlogits, lnf_, wte, C, Vt, dlogits);
    const float* xL = output();
    kernels::fill_zero(dres_, NlC);
    norm_back(xL, uf + lnfw_off_, lnf_mean_, lnf_rstd_, 0);
    float* g[2] = {gf + lnfw_off_, gf + lnfb_off_};
    finish_replicated(g, 2);
    // Twice: once for this backward's acquire, once for the forward's.
    for (int k = 0; k < 2; ++k) {
      st.release_params(head_unit_);
      st.release_params(head_wte_unit_);
    }
    // Units complete from the last to the first (the data-parallel buckets rely on it).
    if (!input_only) {
      if (head_wte_unit_ > head_unit_) st.grads_done(head_wte_unit_);
      st.grads_done(head_unit_);
    }
  }
  for (int lb = blocks_ - 1; lb >= 0; --lb) {
    const int l = stage_.first + lb;
    ScopedSpan s(tl, l + 1, phase);
    const int eu = expert_unit_[std::size_t(lb)];
    const bool moe = eu >= 0;
    LayerParams p = layer_view(st.acquire_params(block_unit(lb)), moe ? st.acquire_params(eu) : nullptr, lb);
    if (lb > 0) st.prefetch(block_unit(lb - 1));
    LayerParams g = layer_view(st.grads(block_unit(lb)), moe ? st.grads(eu) : nullptr, lb);
    const float* x = lb == 0 ? encoded_ : res3_ + (lb - 1) * NlC;
    const BlockActs a = block_acts(lb);
    if (c_.recompute == Recompute::full) {
      // The block's forward again from its stored input (a MoE layer keeps
      // its own activations and routing: only its input is rebuilt). The
      // time counts in the block's backward span.
      const prof::Recomputing again;
      block_front(a, p, x);
      if (!moe) mlp_front(a, p);
    }
    const float *ln1 = a.ln1, *qkv = a.qkv, *atty = a.atty, *att = a.att, *res2 = a.res2, *ln2 = a.ln2,
                *fch = a.fch, *fch_gelu = a.fch_gelu;
    // Input-only, the MLP's and QKV's output gradients are written straight
    // into the kept buffers.
    const std::int64_t di = std::max(dense_index_[std::size_t(lb)], 0);  // the dense MLP's kept gradients
    float* dfch = input_only ? dy_fc_ + di * N * Ft : dfch_;
    float* dqkv = input_only ? dy_qkv_ + std::int64_t(lb) * N * 3 * Ct : dqkv_;
    float* keep3 = input_only ? dy_fcproj_ + di * NC : nullptr;
    float* keep2 = input_only ? dy_proj_ + lb * NC : nullptr;

    // MLP branch: dres_ holds d(res3); the identity path leaves it as d(res2).
    // The row-parallel projection's input gradient needs the residual
    // gradient of every row (g backward); its bias, whole on every rank,
    // takes this rank's rows (a replicated gradient, slot 5); the
    // column-parallel input's gradient is summed over ranks (f backward, in
    // norm_back).
    const float* d3 = dres_all();
    if (moe) {
      // The whole MoE backward (experts and router) runs here, in the
      // input-gradient half of a split backward too: its weight gradients
      // come with the routing it must replay. Every tensor-parallel rank
      // computes the whole input gradient and the whole expert and router
      // gradients.
      kernels::fill_zero(dbuf_, NC);
      moe_[std::size_t(lb)]->backward(dbuf_, d3, ln2, {p.router, p.fc_w, p.fc_b, p.fcproj_w, p.fcproj_b},
                                      {g.router, g.fc_w, g.fc_b, g.fcproj_w, g.fcproj_b}, loss_scale);
      st.release_params(eu);
      if (!input_only) st.grads_done(eu);  // the experts' unit follows the block's: it completes first
    } else {
      linear_back(dgelu_, g.fcproj_w, nullptr, d3, fch_gelu, p.fcproj_w, Ft, C, keep3);
      kernels::bias_backward(rep_grads_ + 5 * C, dres_, Nl, C);
      kernels::fill_zero(dfch, std::int64_t(N) * Ft);
      kernels::gelu_backward(dfch, fch, dgelu_, std::int64_t(N) * Ft);
      linear_back(dbuf_, g.fc_w, g.fc_b, dfch, ln2, p.fc_w, C, Ft, dfch);
    }
    norm_back(res2, p.ln2_w, a.ln2_mean, a.ln2_rstd, 3, !moe);
    // Attention branch: dres_ now holds d(res2).
    const float* d2 = dres_all();
    linear_back(dbuf_, g.proj_w, nullptr, d2, atty, p.proj_w, Ct, C, keep2);
    kernels::bias_backward(rep_grads_ + 2 * C, dres_, Nl, C);
    kernels::fill_zero(dqkv, std::int64_t(N) * 3 * Ct);
    // Selective recomputation: the attention probabilities again from q
    // and k (Korthikanti et al.); atty gets the same values it holds.
    if (c_.recompute == Recompute::selective) {
      const prof::Recomputing again;
      cp_->attention_forward(a.atty, a.att, dprobs_, a.qkv, B, T, Ct, NHt);
    }
    cp_->attention_backward(dqkv, dprobs_, dbuf_, qkv, atty, att, B, T, Ct, NHt);
    linear_back(dbuf_, g.qkv_w, g.qkv_b, dqkv, ln1, p.qkv_w, C, 3 * Ct, dqkv);
    norm_back(x, p.ln1_w, a.ln1_mean, a.ln1_rstd, 0);
    float* gs[6] = {g.ln1_w, g.ln1_b, g.proj_b, g.ln2_w, g.ln2_b, g.fcproj_b};
    finish_replicated(gs, moe ? 5 : 6);  // a MoE block's output biases belong to its experts
    st.release_params(block_unit(lb));
    if (!input_only) st.grads_done(block_unit(lb));
  }
  if (!stage_.embedding) return;  // input_grad() (dres_) holds the gradient of this stage's input
  ScopedSpan s(tl, 0, phase);
  // The embedding's backward needs no parameters, only the token ids; each
  // rank scatters into the vocabulary rows it holds. It runs in the
  // input-gradient half too: that is where dres_ is at hand.
  const float* drows = dres_all();
  kernels::embedding_backward(st.grads(kWteUnit), cp_->size() > 1 ? nullptr : st.grads(kWpeUnit), drows, tokens, B,
                              T, C, v0, Vt);
  if (cp_->size() > 1) position_grads(st.grads(kWpeUnit), drows);
  if (!input_only) {
    st.grads_done(kWpeUnit);
    st.grads_done(kWteUnit);
  }
}

// The weight-gradient half of a split backward pass: every linear's weight
// and bias gradient from its input (kept by the forward pass) and its output
// gradient (kept by backward(input_only)). No parameter is read.
void Gpt::backward_weight(ParamState& st, prof::Timeline* tl) {
  STRATA_CHECK(split_, "backward_weight needs a model built with split_backward");
  const int N = B_ * T_, C = c_.d_model, L = c_.layers, tp = tp_->size();
  const int Ct = C / tp, Ft = c_.ffn() / tp, Vt = c_.vocab / tp;
  const std::int64_t NC = std::int64_t(N) * C;
  if (stage_.head) {
    ScopedSpan s(tl, L + 1, Phase::backward_weight);
    linear_backward_weight(st.grads(head_wte_unit_), nullptr, logits_, lnf_, N, C, Vt);
    if (head_wte_unit_ > head_unit_) st.grads_done(head_wte_unit_);
    st.grads_done(head_unit_);
  }
  for (int lb = blocks_ - 1; lb >= 0; --lb) {
    ScopedSpan s(tl, stage_.first + lb + 1, Phase::backward_weight);
    const int eu = expert_unit_[std::size_t(lb)];
    LayerParams g = layer_view(st.grads(block_unit(lb)), nullptr, lb);
    if (eu >= 0) {
      st.grads_done(eu);  // its gradients came with the input-gradient half
    } else {
      const std::int64_t di = dense_index_[std::size_t(lb)];
      // The row-parallel biases came with the input half (replicated gradients).
      linear_backward_weight(g.fcproj_w, nullptr, dy_fcproj_ + di * NC, block_acts(lb).fch_gelu, N, Ft, C);
      linear_backward_weight(g.fc_w, g.fc_b, dy_fc_ + di * N * Ft, ln2_ + lb * NC, N, C, Ft);
    }
    linear_backward_weight(g.proj_w, nullptr, dy_proj_ + lb * NC, atty_ + std::int64_t(lb) * N * Ct, N, Ct, C);
    linear_backward_weight(g.qkv_w, g.qkv_b, dy_qkv_ + std::int64_t(lb) * N * 3 * Ct, ln1_ + lb * NC, N, C, 3 * Ct);
    st.grads_done(block_unit(lb));
  }
  if (stage_.embedding) {
    st.grads_done(kWpeUnit);
    st.grads_done(kWteUnit);
  }
}

}  // namespace strata::models
