#include "models/moe.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/kernels.hpp"
#include "models/linear.hpp"
#include "src/core/error.hpp"

namespace strata::models {

using core::MemCategory;

int moe_capacity(const MoeConfig& c, int tokens) {
  if (!c.drop_tokens) return tokens;  // an expert appears at most once among a token's choices
  return std::min(tokens, int(std::ceil(c.capacity_factor * double(tokens) * c.top_k / c.experts)));
}

MoeLayer::MoeLayer(const MoeConfig& c, int tokens, core::MemoryTracker& tracker)
    : c_(c), N_(tokens), cap_(moe_capacity(c, tokens)) {
  STRATA_CHECK(c.top_k >= 1 && c.top_k <= c.experts, "top_k {} of {} experts", c.top_k, c.experts);
  STRATA_CHECK(c.capacity_factor > 0, "capacity factor {}", c.capacity_factor);
  const std::size_t E = std::size_t(c.experts), C = std::size_t(c.d_model), F = std::size_t(c.ffn),
                    slots = E * std::size_t(cap_);
  const auto A = MemCategory::activations, W = MemCategory::workspace;
  probs_ = core::Buffer<float>(tracker, A, std::size_t(N_) * E, "moe router probabilities");
  xin_ = core::Buffer<float>(tracker, A, slots * C, "moe expert inputs");
  hpre_ = core::Buffer<float>(tracker, A, slots * F, "moe expert hidden");
  h_ = core::Buffer<float>(tracker, A, slots * F, "moe expert hidden (gelu)");
  yout_ = core::Buffer<float>(tracker, A, slots * C, "moe expert outputs");
  dyout_ = core::Buffer<float>(tracker, W, slots * C, "moe d expert outputs");
  dh_ = core::Buffer<float>(tracker, W, slots * F, "moe d expert hidden");
  dxin_ = core::Buffer<float>(tracker, W, slots * C, "moe d expert inputs");
  dhpre_ = core::Buffer<float>(tracker, W, slots * F, "moe d expert hidden (pre-gelu)");
  dgate_ = core::Buffer<float>(tracker, W, std::size_t(N_) * c.top_k, "moe d gates");
  dlogits_ = core::Buffer<float>(tracker, W, std::size_t(N_) * E, "moe d router logits");
  topk_.assign(std::size_t(N_) * c.top_k, 0);
  slot_.assign(std::size_t(N_) * c.top_k, -1);
  gate_.assign(std::size_t(N_) * c.top_k, 0.0f);
  tok_.assign(slots, -1);
}

float MoeLayer::forward(float* y, const float* x, const MoeParams& p) {
  const int N = N_, C = c_.d_model, F = c_.ffn, E = c_.experts, K = c_.top_k;
  float* probs = probs_.data();
  // Router: logits = x W_r^T, softmax per token (in place).
  linear_forward(probs, x, p.router, nullptr, N, C, E);
  for (int t = 0; t < N; ++t) {
    float* r = probs + std::int64_t(t) * E;
    const float m = *std::max_element(r, r + E);
    double s = 0;
    for (int e = 0; e < E; ++e) s += (r[e] = std::exp(r[e] - m));
    for (int e = 0; e < E; ++e) r[e] = float(r[e] / s);
  }
  // Top-k per token (ties to the lower index) and the gates.
  mass_.assign(std::size_t(E), 0.0);
  first_share_.assign(std::size_t(E), 0.0);
  for (int t = 0; t < N; ++t) {
    const float* r = probs + std::int64_t(t) * E;
    int* top = topk_.data() + std::int64_t(t) * K;
    for (int j = 0; j < K; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        if (std::find(top, top + j, e) != top + j) continue;
        if (best < 0 || r[e] > r[best]) best = e;
      }
      top[j] = best;
    }
    double s = 0;
    for (int j = 0; j < K; ++j) s += r[top[j]];
    for (int j = 0; j < K; ++j) gate_[std::size_t(t) * K + j] = c_.renormalize ? float(r[top[j]] / s) : r[top[j]];
    for (int e = 0; e < E; ++e) mass_[std::size_t(e)] += r[e];
    first_share_[std::size_t(top[0])] += 1.0 / N;
  }
  // Slots: choice by choice, token by token, up to the capacity.
  count_.assign(std::size_t(E), 0);
  routed_.assign(std::size_t(E), 0);
  dropped_ = 0;
  for (int j = 0; j < K; ++j)
    for (int t = 0; t < N; ++t) {
      const int e = topk_[std::size_t(t) * K + j];
      ++routed_[std::size_t(e)];
      int& s = slot_[std::size_t(t) * K + j];
      if (count_[std::size_t(e)] < cap_) {
        s = count_[std::size_t(e)]++;
        tok_[std::size_t(e) * cap_ + s] = t;
      } else {
        s = -1;
        ++dropped_;
      }
    }
  // Each expert's MLP over its tokens.
  std::memset(y, 0, sizeof(float) * std::size_t(N) * C);
  for (int e = 0; e < E; ++e) {
    const int n = count_[std::size_t(e)];
    if (n == 0) continue;
    const std::int64_t base = std::int64_t(e) * cap_;
    float* xin = xin_.data() + base * C;
    float* hpre = hpre_.data() + base * F;
    float* h = h_.data() + base * F;
    float* yout = yout_.data() + base * C;
    for (int s = 0; s < n; ++s)
      std::memcpy(xin + std::int64_t(s) * C, x + std::int64_t(tok_[std::size_t(base + s)]) * C, sizeof(float) * C);
    linear_forward(hpre, xin, p.fc_w + std::int64_t(e) * F * C, p.fc_b + std::int64_t(e) * F, n, C, F);
    kernels::gelu_forward(h, hpre, std::int64_t(n) * F);
    linear_forward(yout, h, p.proj_w + std::int64_t(e) * C * F, p.proj_b + std::int64_t(e) * C, n, F, C);
  }
  // Combine: y[t] = sum over kept choices of gate x expert output.
  for (int t = 0; t < N; ++t)
    for (int j = 0; j < K; ++j) {
      const int s = slot_[std::size_t(t) * K + j];
      if (s < 0) continue;
      const int e = topk_[std::size_t(t) * K + j];
      const float g = gate_[std::size_t(t) * K + j];
      const float* src = yout_.data() + (std::int64_t(e) * cap_ + s) * C;
      float* dst = y + std::int64_t(t) * C;
      for (int k = 0; k < C; ++k) dst[k] += g * src[k];
    }
  double aux = 0;
  for (int e = 0; e < E; ++e) aux += first_share_[std::size_t(e)] * (mass_[std::size_t(e)] / N);
  aux_ = float(c_.aux_coef * E * aux);
  return aux_;
}

void MoeLayer::backward(float* dx, const float* dy, const float* x, const MoeParams& p, const MoeGrads& g,
                        float aux_scale) {
  const int N = N_, C = c_.d_model, F = c_.ffn, E = c_.experts, K = c_.top_k;
  const float* probs = probs_.data();
  // d(gate) per choice, and each kept choice's output gradient into its slot.
  float* dgate = dgate_.data();
  kernels::fill_zero(dgate, std::int64_t(N) * K);
  for (int t = 0; t < N; ++t)
    for (int j = 0; j < K; ++j) {
      const int s = slot_[std::size_t(t) * K + j];
      if (s < 0) continue;
      const int e = topk_[std::size_t(t) * K + j];
      const float gt = gate_[std::size_t(t) * K + j];
      const float* d = dy + std::int64_t(t) * C;
      const float* out = yout_.data() + (std::int64_t(e) * cap_ + s) * C;
      float* dout = dyout_.data() + (std::int64_t(e) * cap_ + s) * C;
      double dot = 0;
      for (int k = 0; k < C; ++k) {
        dout[k] = gt * d[k];
        dot += double(d[k]) * out[k];
      }
      dgate[std::size_t(t) * K + j] = float(dot);
    }
  // Experts: the MLP backward over each expert's slots, input gradients
  // scattered back to their tokens.
  for (int e = 0; e < E; ++e) {
    const int n = count_[std::size_t(e)];
    if (n == 0) continue;
    const std::int64_t base = std::int64_t(e) * cap_;
    const float* xin = xin_.data() + base * C;
    const float* hpre = hpre_.data() + base * F;
    const float* h = h_.data() + base * F;
    const float* dout = dyout_.data() + base * C;
    float* dh = dh_.data() + base * F;
    float* dxin = dxin_.data() + base * C;
    linear_backward(dh, g.proj_w + std::int64_t(e) * C * F, g.proj_b + std::int64_t(e) * C, dout, h,
                    p.proj_w + std::int64_t(e) * C * F, n, F, C);
    // The GELU's input gradient (the kernel accumulates: start from zero).
    float* dpre = dhpre_.data() + base * F;
    kernels::fill_zero(dpre, std::int64_t(n) * F);
    kernels::gelu_backward(dpre, hpre, dh, std::int64_t(n) * F);
    linear_backward(dxin, g.fc_w + std::int64_t(e) * F * C, g.fc_b + std::int64_t(e) * F, dpre, xin,
                    p.fc_w + std::int64_t(e) * F * C, n, C, F);
    for (int s = 0; s < n; ++s) {
      float* d = dx + std::int64_t(tok_[std::size_t(base + s)]) * C;
      const float* src = dxin + std::int64_t(s) * C;
      for (int k = 0; k < C; ++k) d[k] += src[k];
    }
  }
  // Router: d(probs) from the gates (renormalised: g_j = p_j / S over the
  // top-k) and from the auxiliary loss (dL/dp[t, e] = coef E f_e / N, f
  // being counts), then the softmax backward and the router linear.
  float* dlogits = dlogits_.data();
  const double aux_grad = double(aux_scale) * c_.aux_coef * E / N;
  std::vector<double> dp(static_cast<std::size_t>(E));  // one token's d(probs)
  for (int t = 0; t < N; ++t) {
    const float* r = probs + std::int64_t(t) * E;
    const int* top = topk_.data() + std::int64_t(t) * K;
    const float* dg = dgate + std::int64_t(t) * K;
    for (int e = 0; e < E; ++e) dp[std::size_t(e)] = aux_grad * first_share_[std::size_t(e)];
    if (c_.renormalize) {
      double S = 0, sum_dg_p = 0;
      for (int j = 0; j < K; ++j) S += r[top[j]];
      for (int j = 0; j < K; ++j) sum_dg_p += double(dg[j]) * r[top[j]];
      for (int j = 0; j < K; ++j) dp[std::size_t(top[j])] += dg[j] / S - sum_dg_p / (S * S);
    } else {
      for (int j = 0; j < K; ++j) dp[std::size_t(top[j])] += dg[j];
    }
    double dot = 0;
    for (int e = 0; e < E; ++e) dot += double(r[e]) * dp[std::size_t(e)];
    for (int e = 0; e < E; ++e) dlogits[std::size_t(t) * E + e] = float(r[e] * (dp[std::size_t(e)] - dot));
  }
  linear_backward(dx, g.router, nullptr, dlogits, x, p.router, N, C, E, /*accumulate_dinp=*/true);
}

}  // namespace strata::models
