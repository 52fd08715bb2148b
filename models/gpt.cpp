// GPT forward and backward over one micro-batch. The residual stream of block
// l is res3[l-1] (or the embedding output for l = 0); the backward pass keeps
// a single running residual gradient `dres_` that every branch accumulates
// into, as the kernels' += convention allows.
#include "models/gpt.hpp"

#include <cmath>
#include <cstring>

#include "kernels/kernels.hpp"
#include "models/init.hpp"
#include "models/linear.hpp"
#include "src/core/error.hpp"

namespace strata::models {

using core::MemCategory;
using prof::Phase;
using prof::ScopedSpan;

static std::string lname(int l, const char* what) { return "h." + std::to_string(l) + "." + what; }

ParamRegistry gpt_registry(const GptConfig& c) {
  const std::int64_t C = c.d_model, F = c.ffn(), V = c.vocab, T = c.seq_len;
  // GPT-2's initialisation: N(0, 0.02) for matrices, the residual output
  // projections scaled by 1/sqrt(2 L) so the stream's variance stays bounded.
  const float std = 0.02f, res_std = 0.02f / std::sqrt(2.0f * float(c.layers));
  ParamRegistry r;
  r.add("wte", {V, C}, Init::normal, std, true);
  r.add("wpe", {T, C}, Init::normal, std, true);
  for (int l = 0; l < c.layers; ++l) {
    r.add(lname(l, "ln1.weight"), {C}, Init::ones, 0, false);
    r.add(lname(l, "ln1.bias"), {C}, Init::zeros, 0, false);
    r.add(lname(l, "attn.qkv.weight"), {3 * C, C}, Init::normal, std, true);
    r.add(lname(l, "attn.qkv.bias"), {3 * C}, Init::zeros, 0, false);
    r.add(lname(l, "attn.proj.weight"), {C, C}, Init::normal, res_std, true);
    r.add(lname(l, "attn.proj.bias"), {C}, Init::zeros, 0, false);
    r.add(lname(l, "ln2.weight"), {C}, Init::ones, 0, false);
    r.add(lname(l, "ln2.bias"), {C}, Init::zeros, 0, false);
    r.add(lname(l, "mlp.fc.weight"), {F, C}, Init::normal, std, true);
    r.add(lname(l, "mlp.fc.bias"), {F}, Init::zeros, 0, false);
    r.add(lname(l, "mlp.proj.weight"), {C, F}, Init::normal, res_std, true);
    r.add(lname(l, "mlp.proj.bias"), {C}, Init::zeros, 0, false);
  }
  r.add("lnf.weight", {C}, Init::ones, 0, false);
  r.add("lnf.bias", {C}, Init::zeros, 0, false);
  return r;
}

std::vector<BufferPlan> gpt_activation_plan(const GptConfig& c, int B) {
  const std::int64_t L = c.layers, C = c.d_model, F = c.ffn(), V = c.vocab, T = c.seq_len, NH = c.heads;
  const std::int64_t N = B * T;
  const auto A = MemCategory::activations, W = MemCategory::workspace;
  return {
      {"encoded", N * C, A},
      {"ln1", L * N * C, A},
      {"ln1_mean", L * N, A},
      {"ln1_rstd", L * N, A},
      {"qkv", L * N * 3 * C, A},
      {"atty", L * N * C, A},
      {"att", L * B * NH * T * T, A},
      {"res2", L * N * C, A},
      {"ln2", L * N * C, A},
      {"ln2_mean", L * N, A},
      {"ln2_rstd", L * N, A},
      {"fch", L * N * F, A},
      {"fch_gelu", L * N * F, A},
      {"res3", L * N * C, A},
      {"lnf", N * C, A},
      {"lnf_mean", N, A},
      {"lnf_rstd", N, A},
      {"logits", N * V, A},  // overwritten in place by dlogits in backward
      {"losses", N, A},
      {"dres", N * C, W},
      {"dbuf", N * C, W},
      {"dqkv", N * 3 * C, W},
      {"dprobs", B * NH * T * T, W},
      {"dfch", N * F, W},
      {"dgelu", N * F, W},
  };
}

std::vector<double> gpt_forward_flops(const GptConfig& c, int B) {
  const double C = c.d_model, F = c.ffn(), V = c.vocab, T = c.seq_len, N = double(B) * T;
  std::vector<double> f(c.layers + 2, 0.0);
  for (int l = 0; l < c.layers; ++l) {
    f[l + 1] = 2 * N * C * 3 * C     // qkv
               + 2 * N * T * C * 2   // q k^T and probs v, all heads
               + 2 * N * C * C       // attention output projection
               + 2 * N * C * F * 2;  // the MLP's two linears
  }
  f[c.layers + 1] = 2 * N * C * V;  // logits
  return f;
}

double gpt_model_flops(const GptConfig& c, int B) {
  double sum = 0;
  for (double x : gpt_forward_flops(c, B)) sum += x;
  return 3.0 * sum;  // backward = 2x forward (input and weight gradients)
}

std::vector<Unit> gpt_units(const ParamRegistry& reg, int layers) {
  std::vector<Unit> u;
  u.push_back({reg.find("wte").offset, reg.find("wpe").offset + reg.find("wpe").numel});
  for (int l = 0; l < layers; ++l) {
    const auto& first = reg.find(lname(l, "ln1.weight"));
    const auto& last = reg.find(lname(l, "mlp.proj.bias"));
    u.push_back({first.offset, last.offset + last.numel});
  }
  u.push_back({reg.find("lnf.weight").offset, reg.numel()});
  return u;
}

Gpt::Gpt(const GptConfig& config, int micro_batch, core::MemoryTracker& tracker)
    : c_(config), B_(micro_batch), reg_(gpt_registry(config)) {
  STRATA_CHECK(c_.d_model % c_.heads == 0, "d_model {} % heads {}", c_.d_model, c_.heads);
  units_ = gpt_units(reg_, c_.layers);
  static const char* kLayerParams[kParamsPerLayer] = {
      "ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
      "ln2.weight", "ln2.bias", "mlp.fc.weight",   "mlp.fc.bias",   "mlp.proj.weight",  "mlp.proj.bias"};
  for (int l = 0; l < c_.layers; ++l) {
    std::array<std::int64_t, kParamsPerLayer> o{};
    for (int k = 0; k < kParamsPerLayer; ++k) o[k] = reg_.find(lname(l, kLayerParams[k])).offset - units_[l + 1].begin;
    layer_offsets_.push_back(o);
  }
  wte_off_ = reg_.find("wte").offset - units_[0].begin;
  wpe_off_ = reg_.find("wpe").offset - units_[0].begin;
  lnfw_off_ = reg_.find("lnf.weight").offset - units_[c_.layers + 1].begin;
  lnfb_off_ = reg_.find("lnf.bias").offset - units_[c_.layers + 1].begin;

  plan_ = gpt_activation_plan(c_, B_);
  for (const auto& p : plan_) acts_.emplace_back(tracker, p.category, p.numel, p.name);
  encoded_ = act("encoded");
  ln1_ = act("ln1"), ln1_mean_ = act("ln1_mean"), ln1_rstd_ = act("ln1_rstd");
  qkv_ = act("qkv"), atty_ = act("atty"), att_ = act("att"), res2_ = act("res2");
  ln2_ = act("ln2"), ln2_mean_ = act("ln2_mean"), ln2_rstd_ = act("ln2_rstd");
  fch_ = act("fch"), fch_gelu_ = act("fch_gelu"), res3_ = act("res3");
  lnf_ = act("lnf"), lnf_mean_ = act("lnf_mean"), lnf_rstd_ = act("lnf_rstd");
  logits_ = act("logits"), losses_ = act("losses");
  dres_ = act("dres"), dbuf_ = act("dbuf"), dqkv_ = act("dqkv"), dprobs_ = act("dprobs");
  dfch_ = act("dfch"), dgelu_ = act("dgelu");
}

float* Gpt::act(const char* name) {
  for (std::size_t i = 0; i < plan_.size(); ++i)
    if (plan_[i].name == name) return acts_[i].data();
  core::runtime_error("no activation buffer '{}'", name);
}

Gpt::LayerParams Gpt::layer_view(float* base, int l) const {
  const auto& o = layer_offsets_[l];
  return {base + o[0], base + o[1], base + o[2], base + o[3], base + o[4],  base + o[5],
          base + o[6], base + o[7], base + o[8], base + o[9], base + o[10], base + o[11]};
}

float Gpt::forward(ParamState& st, const std::int32_t* tokens, const std::int32_t* targets, prof::Timeline* tl) {
  const int B = B_, T = c_.seq_len, C = c_.d_model, F = c_.ffn(), V = c_.vocab, NH = c_.heads, L = c_.layers;
  const int N = B * T;
  const std::int64_t NC = std::int64_t(N) * C;
  {
    ScopedSpan s(tl, 0, Phase::forward);
    float* u0 = st.acquire_params(0);
    st.prefetch(1);
    kernels::embedding_forward(encoded_, tokens, u0 + wte_off_, u0 + wpe_off_, B, T, C);
    st.release_params(0);
  }
  for (int l = 0; l < L; ++l) {
    ScopedSpan s(tl, l + 1, Phase::forward);
    LayerParams p = layer_view(st.acquire_params(l + 1), l);
    st.prefetch(l + 2);
    const float* x = l == 0 ? encoded_ : res3_ + (l - 1) * NC;
    float* ln1 = ln1_ + l * NC;
    float* qkv = qkv_ + l * NC * 3;
    float* atty = atty_ + l * NC;
    float* att = att_ + std::int64_t(l) * B * NH * T * T;
    float* res2 = res2_ + l * NC;
    float* ln2 = ln2_ + l * NC;
    float* fch = fch_ + std::int64_t(l) * N * F;
    float* fch_gelu = fch_gelu_ + std::int64_t(l) * N * F;
    float* res3 = res3_ + l * NC;

    kernels::layernorm_forward(ln1, ln1_mean_ + l * N, ln1_rstd_ + l * N, x, p.ln1_w, p.ln1_b, N, C);
    linear_forward(qkv, ln1, p.qkv_w, p.qkv_b, N, C, 3 * C);
    kernels::attention_forward(atty, att, qkv, B, T, C, NH);
    // res2 = x + atty Wp^T + bp, accumulated straight into the residual copy.
    std::memcpy(res2, x, sizeof(float) * NC);
    linear_forward(res2, atty, p.proj_w, p.proj_b, N, C, C, /*accumulate=*/true);
    kernels::layernorm_forward(ln2, ln2_mean_ + l * N, ln2_rstd_ + l * N, res2, p.ln2_w, p.ln2_b, N, C);
    linear_forward(fch, ln2, p.fc_w, p.fc_b, N, C, F);
    kernels::gelu_forward(fch_gelu, fch, std::int64_t(N) * F);
    std::memcpy(res3, res2, sizeof(float) * NC);
    linear_forward(res3, fch_gelu, p.fcproj_w, p.fcproj_b, N, F, C, /*accumulate=*/true);
    st.release_params(l + 1);
  }
  ScopedSpan s(tl, L + 1, Phase::forward);
  // The head's units stay acquired until its backward, which comes next.
  float* uf = st.acquire_params(L + 1);
  float* wte = st.acquire_params(0) + wte_off_;
  const float* xL = L == 0 ? encoded_ : res3_ + (L - 1) * NC;
  kernels::layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, xL, uf + lnfw_off_, uf + lnfb_off_, N, C);
  linear_forward(logits_, lnf_, wte, nullptr, N, C, V);  // tied head: logits = lnf wte^T
  kernels::softmax_cross_entropy_forward(losses_, logits_, targets, N, V);
  double sum = 0;
  for (int i = 0; i < N; ++i) sum += losses_[i];
  return float(sum / N);
}

void Gpt::backward(ParamState& st, const std::int32_t* tokens, const std::int32_t* targets, float loss_scale,
                   prof::Timeline* tl) {
  const int B = B_, T = c_.seq_len, C = c_.d_model, F = c_.ffn(), V = c_.vocab, NH = c_.heads, L = c_.layers;
  const int N = B * T;
  const std::int64_t NC = std::int64_t(N) * C;
  float* dwte = st.grads(0) + wte_off_;
  {
    ScopedSpan s(tl, L + 1, Phase::backward);
    // Acquired by the forward pass: these return the same pointers.
    float* uf = st.acquire_params(L + 1);
    float* wte = st.acquire_params(0) + wte_off_;
    st.prefetch(L);  // the last block's backward comes next
    float* gf = st.grads(L + 1);
    float* dlogits = logits_;  // in place
    kernels::softmax_cross_entropy_backward(dlogits, logits_, targets, loss_scale / float(N), N, V);
    linear_backward(dbuf_, dwte, nullptr, dlogits, lnf_, wte, N, C, V);
    const float* xL = L == 0 ? encoded_ : res3_ + (L - 1) * NC;
    kernels::fill_zero(dres_, NC);
    kernels::layernorm_backward(dres_, gf + lnfw_off_, gf + lnfb_off_, dbuf_, xL, uf + lnfw_off_, lnf_mean_,
                                lnf_rstd_, N, C);
    // Twice: once for this backward's acquire, once for the forward's.
    for (int k = 0; k < 2; ++k) {
      st.release_params(L + 1);
      st.release_params(0);
    }
    st.grads_done(L + 1);
  }
  for (int l = L - 1; l >= 0; --l) {
    ScopedSpan s(tl, l + 1, Phase::backward);
    LayerParams p = layer_view(st.acquire_params(l + 1), l);
    if (l > 0) st.prefetch(l);
    LayerParams g = layer_view(st.grads(l + 1), l);
    const float* x = l == 0 ? encoded_ : res3_ + (l - 1) * NC;
    const float* ln1 = ln1_ + l * NC;
    const float* qkv = qkv_ + l * NC * 3;
    const float* atty = atty_ + l * NC;
    const float* att = att_ + std::int64_t(l) * B * NH * T * T;
    const float* res2 = res2_ + l * NC;
    const float* ln2 = ln2_ + l * NC;
    const float* fch = fch_ + std::int64_t(l) * N * F;
    const float* fch_gelu = fch_gelu_ + std::int64_t(l) * N * F;

    // MLP branch: dres_ holds d(res3); the identity path leaves it as d(res2).
    linear_backward(dgelu_, g.fcproj_w, g.fcproj_b, dres_, fch_gelu, p.fcproj_w, N, F, C);
    kernels::fill_zero(dfch_, std::int64_t(N) * F);
    kernels::gelu_backward(dfch_, fch, dgelu_, std::int64_t(N) * F);
    linear_backward(dbuf_, g.fc_w, g.fc_b, dfch_, ln2, p.fc_w, N, C, F);
    kernels::layernorm_backward(dres_, g.ln2_w, g.ln2_b, dbuf_, res2, p.ln2_w, ln2_mean_ + l * N,
                                ln2_rstd_ + l * N, N, C);
    // Attention branch: dres_ now holds d(res2).
    linear_backward(dbuf_, g.proj_w, g.proj_b, dres_, atty, p.proj_w, N, C, C);
    kernels::fill_zero(dqkv_, NC * 3);
    kernels::attention_backward(dqkv_, dprobs_, dbuf_, qkv, att, B, T, C, NH);
    linear_backward(dbuf_, g.qkv_w, g.qkv_b, dqkv_, ln1, p.qkv_w, N, C, 3 * C);
    kernels::layernorm_backward(dres_, g.ln1_w, g.ln1_b, dbuf_, x, p.ln1_w, ln1_mean_ + l * N, ln1_rstd_ + l * N,
                                N, C);
    st.release_params(l + 1);
    st.grads_done(l + 1);
  }
  ScopedSpan s(tl, 0, Phase::backward);
  // The embedding's backward needs no parameters, only the token ids.
  kernels::embedding_backward(dwte, st.grads(0) + wpe_off_, dres_, tokens, B, T, C);
  st.grads_done(0);
}

}  // namespace strata::models
