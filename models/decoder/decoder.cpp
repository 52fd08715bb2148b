// Decoder forward and backward over one micro-batch. The residual stream of
// block l is blocks_[l].out (the stage's input for the first); the backward
// pass keeps a single running residual gradient `dres_` that every branch
// accumulates into, as the kernels' += convention allows.
#include "models/decoder/decoder.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>


#include "kernels/foundation/error.hpp"
#include "kernels/kernels.hpp"
#include "kernels/unfused_attention.hpp"
#include "models/init.hpp"
#include "models/linear.hpp"

namespace strata::models {

using core::MemCategory;
using prof::Phase;
using prof::ScopedSpan;

static std::string lname(int l, const char* what) { return "h." + std::to_string(l) + "." + what; }

// The parameter at `offset` of a unit's values (or gradients) p, or null
// for a parameter the model has not (offset -1: a bias of a bias-free block).
template <typename T>
static T* param(T* p, std::int64_t offset) {
  return offset >= 0 ? p + offset : nullptr;
}
static core::CPtr param(core::CPtr p, std::int64_t offset) { return offset >= 0 ? p + offset : nullptr; }

static Stage resolved(const DecoderConfig& c, Stage s) {
  if (s.last < 0) s.last = c.layers;
  return s;
}

DecoderConfig decoder_config(const plan::Plan& p) {
  const plan::ModelSection& m = p.model;
  const MoeBlocks moe{m.moe_experts, m.moe_every, m.moe_top_k, m.moe_capacity_factor, m.moe_drop_tokens,
                      m.moe_renormalize, float(m.moe_aux_coef)};
  return DecoderConfig{m.layers,  m.d_model,  m.heads,       m.ffn_mult, m.vocab, m.seq_len, moe, m.recompute,
                       p.backend.precision, p.fused_attention(), p.composed_attention()};
}

ParamRegistry decoder_registry(const DecoderConfig& c, int tp_size, int tp_rank, Stage stage, int ep_size,
                               int ep_rank) {
  stage = resolved(c, stage);
  const std::int64_t C = c.d_model, F = c.ffn(), V = c.vocab, T = c.seq_len, KVC = C / c.heads * c.kv();
  const std::int64_t Fp = activation_inputs(c.act, int(F));  // the first MLP linear's outputs
  // GPT-2's initialisation: N(0, 0.02) for matrices, the residual output
  // projections scaled by 1/sqrt(2 L) so the stream's variance stays bounded.
  const float std = 0.02f, res_std = 0.02f / std::sqrt(2.0f * float(c.layers));
  // Megatron's split: the embedding and an untied head by vocabulary rows;
  // QKV (three sections, or q and the two of k and v) and the first MLP
  // linear (SwiGLU's two sections, gate and up) by output rows
  // (column-parallel); the two output projections by input columns
  // (row-parallel). Norms and the row-parallel biases are whole on every
  // rank.
  const Slice rows{0, 1, tp_size, tp_rank}, qkv_rows{0, 3, tp_size, tp_rank}, pair_rows{0, 2, tp_size, tp_rank},
      cols{1, 1, tp_size, tp_rank};
  const Slice fc_rows = c.act == Activation::swiglu ? pair_rows : rows;
  const bool gqa = c.kv() != c.heads;
  ParamRegistry r;
  // A norm's weight and (LayerNorm) bias; a linear's bias, if the block has them.
  auto norm = [&](const std::string& name) {
    r.add(name + ".weight", {C}, Init::ones, 0, false);
    if (c.norm == Norm::layer) r.add(name + ".bias", {C}, Init::zeros, 0, false);
  };
  auto bias = [&](const std::string& name, std::vector<std::int64_t> shape, Slice s = {}) {
    if (c.bias) r.add(name, std::move(shape), Init::zeros, 0, false, s);
  };
  if (stage.embedding) {
    r.add("wte", {V, C}, Init::normal, std, true, rows);
    if (!c.rope()) r.add("wpe", {T, C}, Init::normal, std, true);
  }
  for (int l = stage.first; l < stage.last; ++l) {
    norm(lname(l, "ln1"));
    // Grouped-query attention stores q and kv apart, so that each is split
    // by heads over tp: a rank's rows of the two are its q heads and its kv
    // heads, side by side as the attention kernels read them.
    if (gqa) {
      r.add(lname(l, "attn.q.weight"), {C, C}, Init::normal, std, true, rows);
      r.add(lname(l, "attn.kv.weight"), {2 * KVC, C}, Init::normal, std, true, pair_rows);
      bias(lname(l, "attn.q.bias"), {C}, rows);
      bias(lname(l, "attn.kv.bias"), {2 * KVC}, pair_rows);
    } else {
      r.add(lname(l, "attn.qkv.weight"), {3 * C, C}, Init::normal, std, true, qkv_rows);
      bias(lname(l, "attn.qkv.bias"), {3 * C}, qkv_rows);
    }
    r.add(lname(l, "attn.proj.weight"), {C, C}, Init::normal, res_std, true, cols);
    bias(lname(l, "attn.proj.bias"), {C});
    norm(lname(l, "ln2"));
    if (c.is_moe(l)) {
      // The router (replicated), then the experts' MLPs stacked expert after
      // expert, each initialised as the dense MLP is: whole on every
      // tensor-parallel rank, split by experts over the expert-parallel ranks.
      const std::int64_t E = c.moe.experts;
      const Slice experts{0, 1, ep_size, ep_rank};
      r.add(lname(l, "moe.router.weight"), {E, C}, Init::normal, std, true);
      r.mark_expert(r.add(lname(l, "moe.experts.fc.weight"), {E, Fp, C}, Init::normal, std, true), experts);
      if (c.bias) r.mark_expert(r.add(lname(l, "moe.experts.fc.bias"), {E, Fp}, Init::zeros, 0, false), experts);
      r.mark_expert(r.add(lname(l, "moe.experts.proj.weight"), {E, C, F}, Init::normal, res_std, true), experts);
      if (c.bias) r.mark_expert(r.add(lname(l, "moe.experts.proj.bias"), {E, C}, Init::zeros, 0, false), experts);
      continue;
    }
    r.add(lname(l, "mlp.fc.weight"), {Fp, C}, Init::normal, std, true, fc_rows);
    bias(lname(l, "mlp.fc.bias"), {Fp}, fc_rows);
    r.add(lname(l, "mlp.proj.weight"), {C, F}, Init::normal, res_std, true, cols);
    bias(lname(l, "mlp.proj.bias"), {C});
  }
  if (stage.head) {
    norm("lnf");
    if (!c.tie_embeddings)
      r.add("lm_head.weight", {V, C}, Init::normal, std, true, rows);
    else if (!stage.embedding)
      r.mark_tied_copy(r.add("wte", {V, C}, Init::normal, std, true, rows));  // the tied copy
  }
  return r;
}

long double decoder_param_count(const DecoderConfig& c) {
  using R = long double;
  const R C = c.d_model, F = c.ffn(), V = c.vocab, T = c.seq_len, E = c.moe.experts, KVC = C / c.heads * c.kv();
  const R Fp = c.act == Activation::swiglu ? 2 * F : F, bias = c.bias ? 1 : 0;
  const R moe_layers = c.moe.experts > 0 ? R(c.layers / c.moe.every) : 0, dense_layers = R(c.layers) - moe_layers;
  // As decoder_registry lays them out: a norm C (LayerNorm 2C), attention
  // (C + 2 KVC) C + C^2 and its biases, and the MLP (Fp C + C F and its
  // biases), or the router EC and E experts' MLPs.
  const R norm = c.norm == Norm::layer ? 2 * C : C;
  const R attention = 2 * norm + (C + 2 * KVC) * C + C * C + bias * (C + 2 * KVC + C);
  const R mlp = Fp * C + C * F + bias * (Fp + C);
  const R embeddings = V * C + (c.rope() ? 0 : T * C) + (c.tie_embeddings ? 0 : V * C);
  return embeddings + dense_layers * (attention + mlp) + moe_layers * (attention + E * C + E * mlp) + norm;
}

std::vector<double> decoder_forward_flops(const DecoderConfig& c, int B) {
  const double C = c.d_model, F = c.ffn(), V = c.vocab, T = c.seq_len, N = double(B) * T;
  const double KVC = C / c.heads * c.kv(), Fp = c.act == Activation::swiglu ? 2 * F : F;
  std::vector<double> f(c.layers + 2, 0.0);
  for (int l = 0; l < c.layers; ++l) {
    f[l + 1] = 2 * N * C * (C + 2 * KVC)  // q, k, v
               + 2 * N * T * C * 2         // q k^T and probs v, all query heads
               + 2 * N * C * C;            // attention output projection
    // The MLP's two linears; a MoE block runs top_k experts per token (as
    // routed, before any dropping) and its router.
    const double mlp = 2 * N * C * (Fp + F);
    f[l + 1] += c.is_moe(l) ? mlp * c.moe.top_k + 2 * N * C * c.moe.experts : mlp;
  }
  f[c.layers + 1] = 2 * N * C * V;  // logits
  return f;
}

double decoder_model_flops(const DecoderConfig& c, int B) {
  double sum = 0;
  for (double x : decoder_forward_flops(c, B)) sum += x;
  return 3.0 * sum;  // backward = 2x forward (input and weight gradients)
}

double decoder_hardware_flops(const DecoderConfig& c, int B) {
  const double C = c.d_model, F = c.ffn(), T = c.seq_len, N = double(B) * T;
  const double KVC = C / c.heads * c.kv(), Fp = c.act == Activation::swiglu ? 2 * F : F;
  double again = 0;
  for (int l = 0; l < c.layers; ++l) {
    const double attention_core = 2 * N * T * C * 2;
    if (c.recompute == Recompute::selective) again += attention_core;
    if (c.recompute == Recompute::full)
      again += 2 * N * C * (C + 2 * KVC) + attention_core + 2 * N * C * C + (c.is_moe(l) ? 0 : 2 * N * C * Fp);
    if (c.recompute == Recompute::op)
      again += 2 * N * C * KVC + 2 * N * C * C + (c.is_moe(l) || c.act != Activation::swiglu ? 0 : 2 * N * C * F);
  }
  return decoder_model_flops(c, B) + again;
}

std::vector<Unit> decoder_units(const ParamRegistry& reg, const DecoderConfig& c, Stage stage) {
  stage = resolved(c, stage);
  std::vector<Unit> u;
  // wte is a unit of its own on both stages that hold it, so that the two
  // copies are sharded alike and their gradients can be summed shard by shard.
  auto span = [&](const std::string& first, const std::string& last) {
    return Unit{reg.find(first).offset, reg.find(last).offset + reg.find(last).numel};
  };
  if (stage.embedding) {
    u.push_back(span("wte", "wte"));
    if (!c.rope()) u.push_back(span("wpe", "wpe"));
  }
  // A MoE block is two units: its attention, norms and router, then its
  // experts, whose gradients are synchronised over another group. A unit
  // runs from its first parameter to its last, as the registry lays them out.
  for (int l = stage.first; l < stage.last; ++l) {
    if (c.is_moe(l)) {
      u.push_back(span(lname(l, "ln1.weight"), lname(l, "moe.router.weight")));
      u.push_back(span(lname(l, "moe.experts.fc.weight"),
                       lname(l, c.bias ? "moe.experts.proj.bias" : "moe.experts.proj.weight")));
    } else {
      u.push_back(span(lname(l, "ln1.weight"), lname(l, c.bias ? "mlp.proj.bias" : "mlp.proj.weight")));
    }
  }
  if (stage.head) {
    const std::string lnf_last = c.norm == Norm::layer ? "lnf.bias" : "lnf.weight";
    u.push_back(span("lnf.weight", c.tie_embeddings ? lnf_last : "lm_head.weight"));
    if (c.tie_embeddings && !stage.embedding) u.push_back(span("wte", "wte"));
  }
  return u;
}

// ---- the linear layer, with its split-backward policy -------------------

void Decoder::Linear::forward(core::Ptr y, core::CPtr x, core::CPtr w, core::CPtr b, int N) const {
  linear_forward(y, x, w, b, N, in, out);
}

void Decoder::Linear::backward(core::Ptr dx, core::CPtr dy, core::CPtr x, core::CPtr w, float* dw, float* db, int N,
                               bool input_only) const {
  linear_backward_input(dx, dy, w, N, in, out);
  if (!input_only)
    linear_backward_weight(dw, db, dy, x, N, in, out);
  else if (core::CPtr(kept) != dy)
    kernels::convert(kept, dy, std::int64_t(N) * out);
}

void Decoder::Linear::weight(float* dw, float* db, core::CPtr x, int N) const {
  linear_backward_weight(dw, db, kept, x, N, in, out);
}

// ---- the feed-forward layers ---------------------------------------------

// A block's feed-forward half. forward() reads ln2 and writes the block's
// output, res2 plus its own; backward() takes the output's gradient of all
// rows (d3) and leaves the gradient of ln2 in dbuf_: partial sums over the
// tensor-parallel ranks (`partial()`), or whole on every rank. Its
// parameters are the block unit's (`p`, `g`) or a unit of its own.
class Decoder::Ffn {
 public:
  virtual ~Ffn() = default;
  virtual double forward(ParamState& st, core::CPtr p, core::CPtr ln2, core::CPtr res2, core::Ptr out) = 0;
  // What its backward reads and the recomputation policy did not keep,
  // rebuilt from ln2 (all of its forward under full recomputation; under
  // the per-op policy, from the matmul outputs it kept).
  virtual void recompute(core::CPtr p, core::CPtr ln2) = 0;
  // Its own unit's parameters, acquired for the backward pass.
  virtual void acquire(ParamState& st) {}
  virtual void backward(ParamState& st, core::CPtr p, float* g, core::CPtr ln2, core::CPtr d3, float loss_scale,
                        bool input_only) = 0;
  virtual void weight(ParamState& st, float* g, core::CPtr ln2) = 0;
  // Whether its input gradient is a partial sum over tp.
  virtual bool partial() const = 0;
  // Its output bias's offset in the block unit when every tensor-parallel
  // rank holds it whole (a replicated gradient: the block's kFfnBias slot),
  // else -1.
  virtual std::int64_t replicated_bias() const { return -1; }
};

// The dense MLP: fc (column-parallel), the activation (GELU, or SwiGLU on
// fc's gate and up halves), proj (row-parallel), its hidden activations
// before and after the activation (the rank's scratch where they are
// rebuilt). Under the per-op policy it keeps fc's output (GELU) or its gate
// half (SwiGLU: the up half is the block's sixth matmul, rebuilt) and
// SwiGLU's proj output (the seventh), as torchtitan's policy keeps them.
struct Decoder::MlpBuffers {
  core::Ptr fch, fch_act, dfch, dact;              // hidden activations; backward scratch
  core::Ptr fc_dy = nullptr, proj_dy = nullptr;  // a split backward's kept output gradients
  core::Ptr gate = nullptr, down = nullptr;      // per-op: kept SwiGLU gate half and proj output
};
class Decoder::Mlp final : public Decoder::Ffn {
 public:
  Mlp(Decoder& g, int layer, int unit, const MlpBuffers& m) : g_(g), m_(m) {
    const int C = g.c_.d_model, Ft = g.c_.ffn() / g.tp_->size();
    auto at = [&](const char* name) { return g.offset_in(unit, lname(layer, name)); };
    fc_w_ = at("mlp.fc.weight"), fc_b_ = at("mlp.fc.bias"), proj_w_ = at("mlp.proj.weight"), proj_b_ = at("mlp.proj.bias");
    fc_ = {C, activation_inputs(g.c_.act, Ft), m.fc_dy}, proj_ = {Ft, C, m.proj_dy};
  }
  double forward(ParamState&, core::CPtr p, core::CPtr ln2, core::CPtr res2, core::Ptr out) override {
    const int C = g_.c_.d_model, F = proj_.in;
    fc_.forward(m_.fch, ln2, p + fc_w_, param(p, fc_b_), N());
    activation_forward(g_.c_.act, m_.fch_act, m_.fch, N(), F);
    proj_.forward(g_.dbuf_, m_.fch_act, p + proj_w_, nullptr, N());
    if (m_.gate) kernels::copy_rows(m_.gate, F, m_.fch, 2 * F, N(), F, false);
    if (m_.down) kernels::convert(m_.down, g_.dbuf_, std::int64_t(N()) * C);
    g_.residual_rows(out, res2, param(p, proj_b_));
    return 0;
  }
  void recompute(core::CPtr p, core::CPtr ln2) override {
    const int F = proj_.in;
    if (g_.c_.recompute == Recompute::full) {
      fc_.forward(m_.fch, ln2, p + fc_w_, param(p, fc_b_), N());
    } else if (m_.gate) {
      // Per-op, SwiGLU: the kept gate half, the up half again (its rows of
      // fc's weight and bias) through the rebuild scratch.
      kernels::copy_rows(m_.fch, 2 * F, m_.gate, F, N(), F, false);
      linear_forward(g_.rebuilt_, ln2, p + fc_w_ + std::int64_t(F) * fc_.in, param(p, fc_b_) + F, N(), fc_.in, F);
      kernels::copy_rows(m_.fch + F, 2 * F, g_.rebuilt_, F, N(), F, false);
    }  // per-op, GELU: fc's output is kept
    activation_forward(g_.c_.act, m_.fch_act, m_.fch, N(), F);
  }
  void backward(ParamState&, core::CPtr p, float* g, core::CPtr ln2, core::CPtr d3, float,
                bool input_only) override {
    // The row-parallel projection's input gradient needs every row's (d3);
    // its bias, whole on every rank, takes this rank's rows (a replicated
    // gradient); fc's input gradient is summed over the ranks (f backward,
    // in the block's norm backward).
    const int C = g_.c_.d_model;
    proj_.backward(m_.dact, d3, m_.fch_act, p + proj_w_, g + proj_w_, nullptr, N(), input_only);
    if (proj_b_ >= 0) kernels::bias_backward(g_.rep_grads_ + kFfnBias * C, g_.dres_, int(g_.Nl_), C);
    core::Ptr dfch = fc_.dy(m_.dfch, input_only);
    kernels::fill_zero(dfch, std::int64_t(N()) * fc_.out);
    activation_backward(g_.c_.act, dfch, m_.fch, m_.dact, N(), proj_.in);
    fc_.backward(g_.dbuf_, dfch, ln2, p + fc_w_, g + fc_w_, param(g, fc_b_), N(), input_only);
  }
  void weight(ParamState&, float* g, core::CPtr ln2) override {
    // The projection's bias came with the input half (a replicated gradient).
    proj_.weight(g + proj_w_, nullptr, m_.fch_act, N());
    fc_.weight(g + fc_w_, param(g, fc_b_), ln2, N());
  }
  bool partial() const override { return true; }
  std::int64_t replicated_bias() const override { return proj_b_; }

 private:
  int N() const { return g_.B_ * g_.T_; }
  Decoder& g_;
  MlpBuffers m_;
  std::int64_t fc_w_, fc_b_, proj_w_, proj_b_;
  Linear fc_, proj_;
};

// The MoE layer (models/moe.hpp): the router and the experts' MLPs, whose
// parameters are a unit of their own. Experts are whole on every
// tensor-parallel rank: each runs the layer over all N rows (the norm
// gathered them under sequence parallelism), so its output is complete,
// not a partial sum, and a sequence-parallel rank keeps its own rows of it.
// Its whole backward (experts and router) runs in the input half of a
// split backward too: its weight gradients come with the routing it must
// replay.
class Decoder::Experts final : public Decoder::Ffn {
 public:
  Experts(Decoder& g, int layer, int block_unit, int unit)
      : g_(g), unit_(unit), layer_(g.c_.moe_layer(), g.B_ * g.T_, *g.tracker_, *g.ep_, g.bufs_.scratch()) {
    g.bufs_.list(layer_.buffers());
    auto at = [&](const char* name, int u) { return g.offset_in(u, lname(layer, name)); };
    router_ = at("moe.router.weight", block_unit);
    fc_w_ = at("moe.experts.fc.weight", unit), fc_b_ = at("moe.experts.fc.bias", unit);
    proj_w_ = at("moe.experts.proj.weight", unit), proj_b_ = at("moe.experts.proj.bias", unit);
  }
  const MoeLayer& layer() const { return layer_; }
  double forward(ParamState& st, core::CPtr p, core::CPtr ln2, core::CPtr res2, core::Ptr out) override {
    const core::CPtr e = st.acquire_params(unit_);
    st.prefetch(unit_ + 1);
    const double aux = layer_.forward(
        g_.dbuf_, ln2, {p + router_, e + fc_w_, param(e, fc_b_), e + proj_w_, param(e, proj_b_)});
    kernels::residual_forward(out, res2, g_.dbuf_ + g_.r0_ * g_.c_.d_model, g_.Nl_ * g_.c_.d_model);
    st.release_params(unit_);
    return aux;
  }
  void recompute(core::CPtr, core::CPtr) override {}  // the layer keeps its own activations and routing
  void acquire(ParamState& st) override { e_ = st.acquire_params(unit_); }
  void backward(ParamState& st, core::CPtr p, float* g, core::CPtr ln2, core::CPtr d3, float loss_scale,
                bool input_only) override {
    float* ge = st.grads(unit_);
    kernels::fill_zero(g_.dbuf_, std::int64_t(g_.B_) * g_.T_ * g_.c_.d_model);
    layer_.backward(g_.dbuf_, d3, ln2, {p + router_, e_ + fc_w_, param(e_, fc_b_), e_ + proj_w_, param(e_, proj_b_)},
                    {g + router_, ge + fc_w_, param(ge, fc_b_), ge + proj_w_, param(ge, proj_b_)}, loss_scale);
    st.release_params(unit_);
    if (!input_only) st.grads_done(unit_);  // the experts' unit follows the block's: it completes first
  }
  void weight(ParamState& st, float*, core::CPtr) override { st.grads_done(unit_); }
  bool partial() const override { return false; }

 private:
  Decoder& g_;
  int unit_;
  MoeLayer layer_;
  core::CPtr e_ = nullptr;
  std::int64_t router_, fc_w_, fc_b_, proj_w_, proj_b_;
};

// ---- the model -------------------------------------------------------------

Decoder::Decoder(const DecoderConfig& config, int micro_batch, core::MemoryTracker& tracker, const Seams& seams,
                 Stage stage, bool split_backward, Scratch* scratch)
    : c_(config), B_(micro_batch), tp_(seams.tp), cp_(seams.cp), ep_(seams.ep), T_(config.seq_len / seams.cp->size()),
      stage_(resolved(config, stage)), split_(split_backward),
      reg_(decoder_registry(config, tp_->size(), tp_->rank(), stage_, ep_->size(), ep_->rank())),
      tracker_(&tracker), bufs_(tracker, scratch) {
  STRATA_CHECK(c_.d_model % c_.heads == 0, "d_model {} % heads {}", c_.d_model, c_.heads);
  // Fused attention runs on the CUDA backend only, whose own attention is
  // fused: unfused there is the composition (which any backend can run).
  const bool cuda = kernels::device() == kernels::Device::cuda;
  STRATA_CHECK(kernels::is_meta() || (c_.fused_attention ? cuda : !cuda || c_.composed_attention),
               "a model with {} attention on the {} backend",
               c_.fused_attention ? "fused" : c_.composed_attention ? "composed unfused" : "unfused",
               kernels::device_name(kernels::device()));
  STRATA_CHECK(!c_.composed_attention || seams.cp->size() == 1, "composed unfused attention under context parallelism");
  STRATA_CHECK(!split_ || c_.recompute == Recompute::none, "a split backward keeps activations recomputation shares");
  STRATA_CHECK(c_.heads % c_.kv() == 0, "heads {} over kv_heads {}", c_.heads, c_.kv());
  STRATA_CHECK(!c_.rope() || (c_.d_model / c_.heads) % 2 == 0, "rotary positions need an even head size, not {}",
               c_.d_model / c_.heads);
  STRATA_CHECK(c_.heads % tp_->size() == 0 && c_.kv() % tp_->size() == 0 && c_.vocab % tp_->size() == 0,
               "heads {}, kv_heads {} and vocab {} over tp {}", c_.heads, c_.kv(), c_.vocab, tp_->size());
  STRATA_CHECK(c_.seq_len % cp_->size() == 0, "seq_len {} over cp {}", c_.seq_len, cp_->size());
  // Per tensor-parallel rank: heads (query and key-value), hidden units and
  // vocabulary are 1/tp; with sequence parallelism the residual stream and
  // the norms' outputs and statistics hold 1/tp of the rows (a norm's output
  // is gathered again in the backward pass for the weight gradients of the
  // linears that read it, as Megatron-LM does). T:
  // this rank's tokens of each sequence (all of them without context
  // parallelism). A qkv row is this rank's q heads then its k and v heads.
  const int tp = tp_->size();
  const std::int64_t C = c_.d_model, Ct = C / tp, F = c_.ffn() / tp, NHt = c_.heads / tp, NKVt = c_.kv() / tp;
  const std::int64_t KVt = (C / c_.heads) * NKVt;  // a rank's k (or v) columns
  const std::int64_t Wqkv = Ct + 2 * KVt, Fp = activation_inputs(c_.act, int(F));
  const std::int64_t N = std::int64_t(B_) * T_;
  Nl_ = tp_->rows(N);
  r0_ = tp_->first_row(N);
  const std::int64_t Nl = Nl_;
  units_ = decoder_units(reg_, c_, stage_);
  const int L = stage_.last - stage_.first;
  const auto A = MemCategory::activations, W = MemCategory::workspace;

  // The recomputation policy: which activations a block keeps for its
  // backward and which its backward rebuilds. Full recomputation keeps
  // every block's output (the next block's input) and rebuilds the rest;
  // selective, the attention state (the probabilities, from q and k); the
  // per-op policy (torchtitan's) keeps the outputs of every second matmul
  // of the block in forward order (q, k, v, the attention projection, the
  // MLP's first and, SwiGLU, its up half, the MLP's projection: q, v, the
  // first and SwiGLU's projection) and attention's outputs, and rebuilds
  // the rest from the block's input. What is rebuilt is one set for all
  // blocks, from the rank's shared scratch: only the pass that runs uses
  // it. What is kept is allocated once per model for its blocks and
  // sliced: block k's at k times its size.
  const bool full = c_.recompute == Recompute::full, op = c_.recompute == Recompute::op;
  const bool probs_rebuilt = c_.recompute == Recompute::selective || full, rebuilt = full || op;
  const bool swiglu = c_.act == Activation::swiglu;
  int D = 0;  // dense blocks: the MLP's hidden activations exist for them only
  for (int l = stage_.first; l < stage_.last; ++l) D += c_.is_moe(l) ? 0 : 1;
  // Activations and their gradients in the run's format (P); the norms'
  // statistics, attention's log-sum-exp (fused), the losses and the
  // replicated parameters' gradients fp32.
  const core::Precision P = c_.precision, F32 = core::Precision::fp32;
  auto per_block = [&](const char* name, std::int64_t n, std::int64_t blocks, bool shared, core::Precision f) {
    return shared ? bufs_.shared(name, std::min<std::int64_t>(blocks, 1) * n, A, f) : bufs_.add(name, blocks * n, A, f);
  };
  const std::int64_t mean_blocks = c_.norm == Norm::layer ? L : 0;  // RMSNorm keeps no mean
  const bool fused = c_.fused_attention;
  const std::int64_t att = cp_->state_elements(fused, B_, int(NHt), int(NKVt), T_, int(Ct));
  encoded_ = bufs_.add("encoded", Nl * C, A, P);
  struct {
    core::Ptr ln1, qkv, atty, att, res2, ln2, ln1_mean, ln1_rstd, ln2_mean, ln2_rstd;
  } all{};
  // The norms' outputs as their rows (a shard under sequence parallelism,
  // gathered again for the linears that read all rows: ln_all_).
  all.ln1 = per_block("ln1", Nl * C, L, rebuilt, P);
  all.ln1_mean = per_block("ln1_mean", Nl, mean_blocks, rebuilt, F32);
  all.ln1_rstd = per_block("ln1_rstd", Nl, L, rebuilt, F32);
  all.qkv = per_block("qkv", N * Wqkv, L, rebuilt, P);
  all.atty = per_block("atty", N * Ct, L, full, P);
  // The probabilities (in P), or (fused) the rows' log-sum-exp (fp32).
  all.att = per_block("att", att, L, probs_rebuilt, cp_->state_format(fused, P));
  all.res2 = per_block("res2", Nl * C, L, rebuilt, P);
  all.ln2 = per_block("ln2", Nl * C, L, rebuilt, P);
  all.ln2_mean = per_block("ln2_mean", Nl, mean_blocks, rebuilt, F32);
  all.ln2_rstd = per_block("ln2_rstd", Nl, L, rebuilt, F32);
  const core::Ptr fch = per_block("fch", N * Fp, D, full || (op && swiglu), P);
  const core::Ptr fch_act = per_block("fch_act", N * F, D, rebuilt, P);
  // Per-op: q and v (Wqv columns a row), SwiGLU's gate half and its
  // projection's output, and the scratch k and the up half are rebuilt in.
  const std::int64_t Wqv = Ct + KVt, kept_op = op ? 1 : 0, kept_swiglu = op && swiglu ? 1 : 0;
  const core::Ptr qv = bufs_.add("q_v", kept_op * L * N * Wqv, A, P);
  const core::Ptr gate = bufs_.add("gate", kept_swiglu * D * N * F, A, P);
  const core::Ptr down = bufs_.add("mlp_out", kept_swiglu * D * N * C, A, P);
  rebuilt_ = bufs_.shared("rebuilt", kept_op * N * std::max(KVt, kept_swiglu * F), W, P);
  const core::Ptr res3 = bufs_.add("res3", L * Nl * C, A, P);
  // Kept from a micro-batch's input-gradient pass to its weight-gradient
  // pass, like activations: every linear's output gradient but the head's
  // (which stays in the logits).
  const std::int64_t kept = split_ ? 1 : 0;
  const core::Ptr qkv_dy = bufs_.add("dy_qkv", kept * L * N * Wqkv, A, P);
  const core::Ptr proj_dy = bufs_.add("dy_proj", kept * L * N * C, A, P);
  const core::Ptr fc_dy = bufs_.add("dy_fc", kept * D * N * Fp, A, P);
  const core::Ptr fcproj_dy = bufs_.add("dy_fcproj", kept * D * N * C, A, P);
  // Backward scratch, shared by every block and every model of the rank.
  dres_ = bufs_.shared("dres", Nl * C, W, P);
  dbuf_ = bufs_.shared("dbuf", N * C, W, P);
  dqkv_ = bufs_.shared("dqkv", N * Wqkv, W, P);
  attn_scratch_ = bufs_.shared_bytes("dprobs", cp_->scratch_bytes(fused, B_, int(NHt), int(NKVt), T_, int(Ct), P), W);
  const core::Ptr dfch = bufs_.shared("dfch", (D > 0 ? 1 : 0) * N * Fp, W, P);
  const core::Ptr dact = bufs_.shared("dact", (D > 0 ? 1 : 0) * N * F, W, P);
  rep_grads_ = bufs_.shared_f32("rep_grads", kReplicated * C, W);
  if (Nl < N) {
    sp_rows_ = bufs_.shared("sp_rows", Nl * C, W, P);
    dres_full_ = bufs_.shared("dres_full", N * C, W, P);
    ln_all_ = bufs_.shared("ln_all", N * C, W, P);
  }
  // Grouped-query attention's q and kv weights (and biases) lie side by
  // side, one [Wqkv, C] matrix for this rank.
  const bool gqa = c_.kv() != c_.heads;
  const char* qkv_w = gqa ? "attn.q.weight" : "attn.qkv.weight";
  const char* qkv_b = gqa ? "attn.q.bias" : "attn.qkv.bias";
  if (stage_.embedding && !c_.rope()) wpe_unit_ = kWteUnit + 1;
  int unit = stage_.embedding ? (c_.rope() ? 1 : 2) : 0, dense = 0;
  for (int lb = 0; lb < L; ++lb) {
    Block& b = blocks_.emplace_back();
    b.layer = stage_.first + lb;
    b.unit = unit++;
    auto at = [&](const char* name) { return offset_in(b.unit, lname(b.layer, name)); };
    b.ln1_w = at("ln1.weight"), b.ln1_b = at("ln1.bias"), b.qkv_w = at(qkv_w), b.qkv_b = at(qkv_b);
    b.proj_w = at("attn.proj.weight"), b.proj_b = at("attn.proj.bias"), b.ln2_w = at("ln2.weight"), b.ln2_b = at("ln2.bias");
    const std::int64_t k = rebuilt ? 0 : lb, ka = probs_rebuilt ? 0 : lb, kt = full ? 0 : lb;
    const std::int64_t km = mean_blocks > 0 ? k : 0;
    b.a = {all.ln1 + k * Nl * C,       all.qkv + k * N * Wqkv,     all.atty + kt * N * Ct,
           all.att + ka * att,         all.res2 + k * Nl * C,      all.ln2 + k * Nl * C,
           (all.ln1_mean + km * Nl).f32(), (all.ln1_rstd + k * Nl).f32(), (all.ln2_mean + km * Nl).f32(),
           (all.ln2_rstd + k * Nl).f32()};
    b.out = res3 + lb * Nl * C;
    b.qv = op ? qv + lb * N * Wqv : nullptr;
    b.qkv = {int(C), int(Wqkv), split_ ? qkv_dy + lb * N * Wqkv : nullptr};
    b.proj = {int(Ct), int(C), split_ ? proj_dy + lb * N * C : nullptr};
    if (c_.is_moe(b.layer)) {
      b.ffn = std::make_unique<Experts>(*this, b.layer, b.unit, unit++);
      continue;
    }
    const std::int64_t kh = full || (op && swiglu) ? 0 : dense, kg = rebuilt ? 0 : dense;
    MlpBuffers m{.fch = fch + kh * N * Fp, .fch_act = fch_act + kg * N * F, .dfch = dfch, .dact = dact};
    if (split_) m.fc_dy = fc_dy + dense * N * Fp, m.proj_dy = fcproj_dy + dense * N * C;
    if (op && swiglu) m.gate = gate + dense * N * F, m.down = down + dense * N * C;
    b.ffn = std::make_unique<Mlp>(*this, b.layer, b.unit, m);
    ++dense;
  }
  if (stage_.head) {
    head_unit_ = unit;
    lnfw_off_ = offset_in(head_unit_, "lnf.weight");
    lnfb_off_ = offset_in(head_unit_, "lnf.bias");
    // The head's weight: its own in the head's unit, or the token embedding
    // (this stage's, or the tied copy in the unit after the head's).
    if (!c_.tie_embeddings) {
      head_w_unit_ = head_unit_;
      head_off_ = offset_in(head_unit_, "lm_head.weight");
    } else {
      head_w_unit_ = stage_.embedding ? kWteUnit : head_unit_ + 1;
    }
    const std::int64_t V = c_.vocab / tp;
    lnf_ = bufs_.add("lnf", Nl * C, A, P);
    lnf_mean_ = bufs_.add_f32("lnf_mean", c_.norm == Norm::layer ? Nl : 0, A);
    lnf_rstd_ = bufs_.add_f32("lnf_rstd", Nl, A);
    // This rank's vocabulary columns, overwritten in place by their gradient,
    // which the head's linear keeps there for a split backward.
    logits_ = bufs_.add("logits", N * V, A, P);
    losses_ = bufs_.add_f32("losses", N, A);
    // The row maximum, sum of exponentials and target logit over the whole vocabulary.
    ce_max_ = bufs_.add_f32("ce_max", N, A);
    ce_sum_ = bufs_.add_f32("ce_sum", N, A);
    ce_target_ = bufs_.add_f32("ce_target", N, A);
    head_ = {int(C), int(V), logits_};
  }
}

std::int64_t Decoder::offset_in(int unit, const std::string& name) const {
  const ParamSpec* p = reg_.lookup(name);
  return p == nullptr ? -1 : p->offset - units_[std::size_t(unit)].begin;
}

Decoder::~Decoder() = default;

const MoeLayer* Decoder::moe_layer(int layer) const {
  const int lb = layer - stage_.first;
  if (lb < 0 || lb >= int(blocks_.size())) return nullptr;
  const auto* e = dynamic_cast<const Experts*>(blocks_[std::size_t(lb)].ffn.get());
  return e != nullptr ? &e->layer() : nullptr;
}

std::vector<std::pair<int, const MoeLayer*>> Decoder::routers() const {
  std::vector<std::pair<int, const MoeLayer*>> out;
  for (const Block& b : blocks_)
    if (const MoeLayer* m = moe_layer(b.layer)) out.push_back({b.layer, m});
  return out;
}

void Decoder::finish_replicated(float* const* grads, int n) {
  const std::int64_t C = c_.d_model;
  tp_->reduce_replicated(rep_grads_, n * C);
  for (int k = 0; k < n; ++k)
    if (grads[k] != nullptr) kernels::add_inplace(grads[k], rep_grads_ + k * C, C);
  kernels::fill_zero(rep_grads_, n * C);
}

namespace {

// Runs of rows whose positions are consecutive: rows [first, first + n) of
// the [B, T] local tokens (row = b T + t) at positions pos, pos + 1, ...,
// as the seam's run_from says (one run never crosses a sequence's end).
template <typename F>
void position_runs(const ContextSeam& cp, std::int64_t first, std::int64_t n, int T, int seq_len, F f) {
  std::int64_t row = first;
  while (row < first + n) {
    const int t = int(row % T), pos = cp.position(t, seq_len);
    const std::int64_t len = std::min<std::int64_t>({cp.run_from(t, seq_len), T - t, first + n - row});
    f(row - first, pos, len);
    row += len;
  }
}

}  // namespace

void Decoder::add_positions(core::Ptr rows, core::CPtr wpe) {
  const int C = c_.d_model;
  if (cp_->size() == 1) {
    kernels::add_position_rows(rows, wpe, int(Nl_), C, T_, int(r0_));
    return;
  }
  position_runs(*cp_, r0_, Nl_, T_, c_.seq_len, [&](std::int64_t i, int pos, std::int64_t len) {
    kernels::add_inplace(rows + i * C, wpe + std::int64_t(pos) * C, len * C);
  });
}

void Decoder::position_grads(float* dwpe, core::CPtr drows) {
  const int C = c_.d_model;
  position_runs(*cp_, 0, std::int64_t(B_) * T_, T_, c_.seq_len, [&](std::int64_t i, int pos, std::int64_t len) {
    kernels::add_inplace(dwpe + std::int64_t(pos) * C, drows + i * C, len * C);
  });
}

core::CPtr Decoder::norm_rows(core::Ptr out, float* mean, float* rstd, core::CPtr x, core::CPtr w, core::CPtr b) {
  // A norm over this rank's rows [Nl, C], kept as they are; all rows [N, C]
  // for the column-parallel linear that reads them (f: gathered into
  // ln_all_ under sequence parallelism).
  const int C = c_.d_model;
  if (c_.norm == Norm::rms)
    kernels::rmsnorm_forward(out, rstd, x, w, int(Nl_), C);
  else
    kernels::layernorm_forward(out, mean, rstd, x, w, b, int(Nl_), C);
  return all_rows(out);
}

core::CPtr Decoder::all_rows(core::CPtr mine) { return tp_->gather(mine, ln_all_, std::int64_t(B_) * T_, c_.d_model); }

void Decoder::residual_rows(core::Ptr out, core::CPtr x, core::CPtr bias) {
  // out[Nl, C] = x + (this rank's rows of the row-parallel partial sums in
  // dbuf_ [N, C], summed over ranks: g) + bias.
  const int C = c_.d_model, N = B_ * T_;
  const core::CPtr sum = tp_->reduce(dbuf_, sp_rows_, N, C);
  kernels::residual_forward(out, x, sum, Nl_ * C);
  if (bias) kernels::bias_add(out, bias, int(Nl_), C);
}

void Decoder::norm_back(core::CPtr x, core::CPtr w, const float* mean, const float* rstd, int k, bool partial) {
  // Into dres_ [Nl, C], from the column-parallel linears' partial input
  // gradients [N, C] in dbuf_ (f backward: this rank's rows of their sum over
  // ranks), or from a whole one (its own rows).
  const int C = c_.d_model, N = B_ * T_;
  const core::CPtr d = partial ? tp_->reduce(dbuf_, sp_rows_, N, C) : core::CPtr(dbuf_ + r0_ * C);
  if (c_.norm == Norm::rms)
    kernels::rmsnorm_backward(dres_, rep_grads_ + std::int64_t(k) * C, d, x, w, rstd, int(Nl_), C);
  else
    kernels::layernorm_backward(dres_, rep_grads_ + std::int64_t(k) * C, rep_grads_ + std::int64_t(k + 1) * C, d, x,
                                w, mean, rstd, int(Nl_), C);
}

void Decoder::rotate(core::Ptr qkv, bool backward, bool k_only) {
  // The q heads and then the k heads start every row: one run of heads
  // (or the k heads' alone).
  const int tp = tp_->size(), hs = c_.d_model / c_.heads, heads = (k_only ? c_.kv() : c_.heads + c_.kv()) / tp;
  const std::int64_t W = std::int64_t(hs) * (c_.heads + 2 * c_.kv()) / tp;
  if (k_only) qkv = qkv + std::int64_t(hs) * c_.heads / tp;
  auto turn = backward ? kernels::rope_backward : kernels::rope_forward;
  if (cp_->size() == 1) {
    turn(qkv, B_, T_, W, heads, hs, 0, c_.rope_theta);
    return;
  }
  position_runs(*cp_, 0, std::int64_t(B_) * T_, T_, c_.seq_len, [&](std::int64_t i, int pos, std::int64_t len) {
    turn(qkv + i * W, 1, int(len), W, heads, hs, pos, c_.rope_theta);
  });
}

core::CPtr Decoder::dres_all() { return tp_->gather(dres_, dres_full_, std::int64_t(B_) * T_, c_.d_model); }

void Decoder::attend(const Acts& a, int C) {
  const int NHt = c_.heads / tp_->size(), NKVt = c_.kv() / tp_->size();
  if (c_.composed_attention)
    kernels::unfused_attention_forward(a.atty, a.att, a.qkv, B_, T_, C, NHt, NKVt);
  else  // over whole sequences: under context parallelism the ring brings the
        // other ranks' keys and values (the backward scratch holds them)
    cp_->attention_forward(a.atty, a.att, attn_scratch_, a.qkv, B_, T_, C, NHt, NKVt);
}

core::CPtr Decoder::attention_half(const Block& b, core::CPtr p, core::CPtr x, bool per_op) {
  const int N = B_ * T_;
  const Acts& a = b.a;
  const core::CPtr ln1 = norm_rows(a.ln1, a.ln1_mean, a.ln1_rstd, x, p + b.ln1_w, param(p, b.ln1_b));
  if (per_op) {
    rebuild_qkv(b, p, ln1);  // attention's output is kept
  } else {
    b.qkv.forward(a.qkv, ln1, p + b.qkv_w, param(p, b.qkv_b), N);  // column-parallel: this rank's heads
    if (c_.rope()) rotate(a.qkv, false);  // kept turned: selective recomputation reads them so
    attend(a, b.proj.in);
  }
  // Row-parallel output projection: partial sums over this rank's heads,
  // summed over the ranks (g), then the bias and the residual, once.
  b.proj.forward(dbuf_, a.atty, p + b.proj_w, nullptr, N);
  residual_rows(a.res2, x, param(p, b.proj_b));
  return norm_rows(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p + b.ln2_w, param(p, b.ln2_b));
}

// Per-op recomputation: q and v of a qkv row (the rank's q columns, then
// its k and its v) to or from their kept copy.
void Decoder::keep_q_v(const Block& b, bool keep) {
  const std::int64_t N = std::int64_t(B_) * T_, Ct = b.proj.in, KVt = (b.qkv.out - Ct) / 2, Wqv = Ct + KVt;
  const core::Ptr qkv = b.a.qkv, qv = b.qv;
  if (keep) {
    kernels::copy_rows(qv, Wqv, qkv, b.qkv.out, N, Ct, false);
    kernels::copy_rows(qv + Ct, Wqv, qkv + Ct + KVt, b.qkv.out, N, KVt, false);
  } else {
    kernels::copy_rows(qkv, b.qkv.out, qv, Wqv, N, Ct, false);
    kernels::copy_rows(qkv + Ct + KVt, b.qkv.out, qv + Ct, Wqv, N, KVt, false);
  }
}

// Per-op recomputation: a block's q k v from its kept q and v and k again
// from ln1 (its rows of the qkv weight, the second of q, k, v's products),
// turned by RoPE.
void Decoder::rebuild_qkv(const Block& b, core::CPtr p, core::CPtr ln1) {
  const int N = B_ * T_, Ct = b.proj.in, KVt = (b.qkv.out - Ct) / 2;
  keep_q_v(b, false);
  linear_forward(rebuilt_, ln1, p + b.qkv_w + std::int64_t(Ct) * b.qkv.in, param(p, b.qkv_b) + Ct, N, b.qkv.in, KVt);
  kernels::copy_rows(b.a.qkv + Ct, b.qkv.out, rebuilt_, KVt, N, KVt, false);
  if (c_.rope()) rotate(b.a.qkv, false, /*k_only=*/true);
}

void Decoder::block_forward(ParamState& st, Block& b, core::CPtr x, double* aux) {
  const core::CPtr p = st.acquire_params(b.unit);
  st.prefetch(b.unit + 1);  // a MoE block's experts, or the next block
  const core::CPtr ln2 = attention_half(b, p, x);
  if (b.qv) keep_q_v(b, true);
  *aux += b.ffn->forward(st, p, ln2, b.a.res2, b.out);
  st.release_params(b.unit);
}

float Decoder::forward(ParamState& st, const std::int32_t* tokens, const std::int32_t* targets, prof::Timeline* tl) {
  // Local sizes: this tensor-parallel rank's vocabulary rows [v0, v0 + Vt);
  // its Nl rows of the residual stream start at row r0 (all of them, from
  // 0, unless sequence parallel).
  const int B = B_, T = T_, C = c_.d_model, L = c_.layers, tp = tp_->size();
  const int Vt = c_.vocab / tp, v0 = tp_->rank() * Vt;
  const int N = B * T, Nl = int(Nl_);
  if (stage_.embedding) {
    ScopedSpan s(tl, 0, Phase::forward);
    const core::CPtr wte = st.acquire_params(kWteUnit);
    const core::CPtr wpe = wpe_unit_ >= 0 ? st.acquire_params(wpe_unit_) : nullptr;
    st.prefetch(wpe_unit_ >= 0 ? wpe_unit_ + 1 : kWteUnit + 1);  // the first block, or the final norm
    // Vocabulary-parallel: each rank looks up the rows it holds (a token
    // outside them gives 0), the sum over ranks is the lookup (g: this
    // rank's rows, in encoded_), then the whole position rows (if learned)
    // are added once.
    const core::Ptr lookup = Nl == N ? encoded_ : dbuf_;  // [N, C]
    kernels::embedding_forward(lookup, tokens, wte, nullptr, B, T, C, v0, Vt);
    const core::CPtr sum = tp_->reduce(lookup, encoded_, N, C);
    STRATA_CHECK(sum == core::CPtr(encoded_), "the embedding's sum outside the stage input");
    if (wpe) {
      add_positions(encoded_, wpe);
      st.release_params(wpe_unit_);
    }
    st.release_params(kWteUnit);
  }
  double aux = 0;  // the MoE blocks' auxiliary losses
  core::CPtr x = encoded_;
  for (Block& b : blocks_) {
    ScopedSpan s(tl, b.layer + 1, Phase::forward);
    block_forward(st, b, x, &aux);
    x = b.out;
  }
  if (!stage_.head) return float(aux);
  ScopedSpan s(tl, L + 1, Phase::forward);
  // The head's units stay acquired until its backward, which comes next.
  const core::CPtr uf = st.acquire_params(head_unit_);
  const core::CPtr hw = head_w_unit_ == head_unit_ ? uf + head_off_ : st.acquire_params(head_w_unit_);
  const core::CPtr lnf = norm_rows(lnf_, lnf_mean_, lnf_rstd_, output(), uf + lnfw_off_, param(uf, lnfb_off_));
  head_.forward(logits_, lnf, hw, nullptr, N);  // this rank's vocabulary columns
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
  for (float v : host_losses_) sum += v;
  return float(sum / N + aux);
}

void Decoder::block_backward(ParamState& st, Block& b, core::CPtr x, int next, float loss_scale, bool input_only) {
  const int N = B_ * T_, C = c_.d_model, NHt = c_.heads / tp_->size(), NKVt = c_.kv() / tp_->size();
  const Acts& a = b.a;
  const core::CPtr p = st.acquire_params(b.unit);
  b.ffn->acquire(st);
  if (next >= 0) st.prefetch(next);  // the block before: its backward comes next
  float* g = st.grads(b.unit);
  core::CPtr ln2 = nullptr;  // all rows of the second norm's output
  if (c_.recompute == Recompute::full || c_.recompute == Recompute::op) {
    // The block's forward again from its stored input, but for what the
    // per-op policy kept (q, v, attention's outputs, the MLP's). The time
    // counts in the block's backward span.
    const prof::Recomputing again;
    ln2 = attention_half(b, p, x, c_.recompute == Recompute::op);
    b.ffn->recompute(p, ln2);
  } else {
    ln2 = all_rows(a.ln2);  // gathered again under sequence parallelism
  }
  // Feed-forward: dres_ holds d(res3); the identity path leaves it as d(res2).
  b.ffn->backward(st, p, g, ln2, dres_all(), loss_scale, input_only);
  norm_back(a.res2, p + b.ln2_w, a.ln2_mean, a.ln2_rstd, kLn2Weight, b.ffn->partial());
  // Attention: dres_ now holds d(res2). The row-parallel projection's input
  // gradient needs every row's; its bias takes this rank's rows.
  b.proj.backward(dbuf_, dres_all(), a.atty, p + b.proj_w, g + b.proj_w, nullptr, N, input_only);
  if (b.proj_b >= 0) kernels::bias_backward(rep_grads_ + kProjBias * C, dres_, int(Nl_), C);
  const core::Ptr dqkv = b.qkv.dy(dqkv_, input_only);
  kernels::fill_zero(dqkv, std::int64_t(N) * b.qkv.out);
  if (c_.recompute == Recompute::selective) {
    // The attention probabilities again from q and k (Korthikanti et al.);
    // atty gets the same values it holds.
    const prof::Recomputing again;
    attend(a, b.proj.in);
  }
  if (c_.composed_attention)
    kernels::unfused_attention_backward(dqkv, core::Ptr(attn_scratch_, a.att.precision()), dbuf_, a.qkv, a.att, B_,
                                        T_, b.proj.in, NHt, NKVt);
  else
    cp_->attention_backward(dqkv, attn_scratch_, dbuf_, a.qkv, a.atty, a.att, B_, T_, b.proj.in, NHt, NKVt);
  if (c_.rope()) rotate(dqkv, true);  // the gradient of q and k before their turn
  b.qkv.backward(dbuf_, dqkv, all_rows(a.ln1), p + b.qkv_w, g + b.qkv_w, param(g, b.qkv_b), N, input_only);
  norm_back(x, p + b.ln1_w, a.ln1_mean, a.ln1_rstd, kLn1Weight);
  // A dense MLP's output bias is replicated; a MoE layer's belong to its experts.
  const std::int64_t ffn_bias = b.ffn->replicated_bias();
  float* rep[kReplicated] = {g + b.ln1_w, param(g, b.ln1_b), param(g, b.proj_b), g + b.ln2_w, param(g, b.ln2_b),
                             param(g, ffn_bias)};
  finish_replicated(rep, ffn_bias >= 0 ? kReplicated : kFfnBias);
  st.release_params(b.unit);
  if (!input_only) st.grads_done(b.unit);
}

void Decoder::backward(ParamState& st, const std::int32_t* tokens, const std::int32_t* targets, float loss_scale,
                   prof::Timeline* tl, bool input_only) {
  STRATA_CHECK(!input_only || split_, "an input-only backward needs a model built with split_backward");
  const int B = B_, T = T_, C = c_.d_model, L = c_.layers, tp = tp_->size();
  const int Vt = c_.vocab / tp, v0 = tp_->rank() * Vt;
  const int N = B * T;
  const std::int64_t NlC = Nl_ * C;
  const Phase phase = input_only ? Phase::backward_input : Phase::backward;
  // Without the head, output_grad() holds the gradient of this stage's output.
  if (!stage_.head) kernels::convert(dres_, output_grad(), NlC);
  if (stage_.head) {
    ScopedSpan s(tl, L + 1, phase);
    // Acquired by the forward pass: these return the same pointers. An
    // untied head's weight is in the head's unit.
    const bool own = head_w_unit_ == head_unit_;
    const core::CPtr uf = st.acquire_params(head_unit_);
    const core::CPtr hw = own ? uf + head_off_ : st.acquire_params(head_w_unit_);
    if (!blocks_.empty()) st.prefetch(blocks_.back().unit);  // the last block's backward comes next
    float* gf = st.grads(head_unit_);
    kernels::softmax_cross_entropy_backward_sharded(logits_, logits_, ce_max_, ce_sum_, targets, v0,
                                                    loss_scale / float(N), N, Vt);
    float* ghw = input_only ? nullptr : own ? gf + head_off_ : st.grads(head_w_unit_);
    head_.backward(dbuf_, logits_, all_rows(lnf_), hw, ghw, nullptr, N, input_only);
    kernels::fill_zero(dres_, NlC);
    norm_back(output(), uf + lnfw_off_, lnf_mean_, lnf_rstd_, 0);
    float* g[2] = {gf + lnfw_off_, param(gf, lnfb_off_)};
    finish_replicated(g, 2);
    // Twice: once for this backward's acquire, once for the forward's.
    for (int k = 0; k < 2; ++k) {
      st.release_params(head_unit_);
      if (!own) st.release_params(head_w_unit_);
    }
    // Units complete from the last to the first (the data-parallel buckets rely on it).
    if (!input_only) {
      if (head_w_unit_ > head_unit_) st.grads_done(head_w_unit_);
      st.grads_done(head_unit_);
    }
  }
  for (std::size_t i = blocks_.size(); i-- > 0;) {
    Block& b = blocks_[i];
    ScopedSpan s(tl, b.layer + 1, phase);
    block_backward(st, b, i == 0 ? core::CPtr(encoded_) : core::CPtr(blocks_[i - 1].out),
                   i == 0 ? -1 : blocks_[i - 1].unit, loss_scale, input_only);
  }
  if (!stage_.embedding) {
    kernels::convert(encoded_, dres_, NlC);  // input_grad(): the gradient of this stage's input
    return;
  }
  ScopedSpan s(tl, 0, phase);
  // The embedding's backward needs no parameters, only the token ids; each
  // rank scatters into the vocabulary rows it holds. It runs in the
  // input-gradient half too: that is where dres_ is at hand.
  const core::CPtr drows = dres_all();
  float* dwpe = wpe_unit_ >= 0 ? st.grads(wpe_unit_) : nullptr;
  kernels::embedding_backward(st.grads(kWteUnit), cp_->size() > 1 ? nullptr : dwpe, drows, tokens, B, T, C, v0, Vt);
  if (cp_->size() > 1 && dwpe != nullptr) position_grads(dwpe, drows);
  if (!input_only) {
    if (wpe_unit_ >= 0) st.grads_done(wpe_unit_);
    st.grads_done(kWteUnit);
  }
}

// The weight-gradient half of a split backward pass: every linear's weight
// and bias gradient from its input (kept by the forward pass) and its output
// gradient (kept by backward(input_only)). No parameter is read.
void Decoder::backward_weight(ParamState& st, prof::Timeline* tl) {
  STRATA_CHECK(split_, "backward_weight needs a model built with split_backward");
  const int N = B_ * T_;
  if (stage_.head) {
    ScopedSpan s(tl, c_.layers + 1, Phase::backward_weight);
    head_.weight(head_w_unit_ == head_unit_ ? st.grads(head_unit_) + head_off_ : st.grads(head_w_unit_), nullptr,
                 all_rows(lnf_), N);
    if (head_w_unit_ > head_unit_) st.grads_done(head_w_unit_);
    st.grads_done(head_unit_);
  }
  for (std::size_t i = blocks_.size(); i-- > 0;) {
    Block& b = blocks_[i];
    ScopedSpan s(tl, b.layer + 1, Phase::backward_weight);
    float* g = st.grads(b.unit);
    b.ffn->weight(st, g, all_rows(b.a.ln2));
    b.proj.weight(g + b.proj_w, nullptr, b.a.atty, N);
    b.qkv.weight(g + b.qkv_w, param(g, b.qkv_b), all_rows(b.a.ln1), N);
    st.grads_done(b.unit);
  }
  if (stage_.embedding) {
    if (wpe_unit_ >= 0) st.grads_done(wpe_unit_);
    st.grads_done(kWteUnit);
  }
}

}  // namespace strata::models
