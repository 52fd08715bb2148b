#include "models/moe.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/kernels.hpp"
#include "models/linear.hpp"
#include "kernels/foundation/error.hpp"

namespace strata::models {

using core::MemCategory;

namespace {
// Expert el's bias of n elements in a stack of them, or null without biases.
float* at(float* biases, int el, std::int64_t n) { return biases == nullptr ? nullptr : biases + std::int64_t(el) * n; }
core::CPtr at(core::CPtr biases, int el, std::int64_t n) { return biases + std::int64_t(el) * n; }

// n elements of a device tensor into host floats, and back (rounded to the
// tensor's format): the host's side of routing, dispatch and combine. On
// the meta device only the copy is counted (the host values are neither
// sized nor walked).
void to_host(std::vector<float>& h, core::CPtr x, std::int64_t n) {
  if (kernels::is_meta()) return kernels::copy_bytes(nullptr, x.get(), std::size_t(n) * x.element_bytes());
  h.resize(std::size_t(n));
  if (x.precision() == core::Precision::fp32)
    return kernels::copy_bytes(h.data(), x.get(), std::size_t(n) * sizeof(float));
  std::vector<std::byte> raw(std::size_t(n) * std::size_t(x.element_bytes()));
  kernels::copy_bytes(raw.data(), x.get(), raw.size());
  kernels::cpu::convert(h.data(), core::CPtr(raw.data(), x.precision()), n);
}
void from_host(core::Ptr y, const std::vector<float>& h, std::int64_t n) {
  if (kernels::is_meta()) return kernels::copy_bytes(y.get(), nullptr, std::size_t(n) * y.element_bytes());
  if (y.precision() == core::Precision::fp32)
    return kernels::copy_bytes(y.get(), h.data(), std::size_t(n) * sizeof(float));
  std::vector<std::byte> raw(std::size_t(n) * std::size_t(y.element_bytes()));
  kernels::cpu::convert(core::Ptr(raw.data(), y.precision()), h.data(), n);
  kernels::copy_bytes(y.get(), raw.data(), raw.size());
}
}  // namespace

int moe_capacity(const MoeConfig& c, int tokens) {
  if (!c.drop_tokens) return tokens;  // an expert appears at most once among a token's choices
  // In double until clamped: a factor of 1e30 asks for more slots than an int
  // holds, and an expert never takes more than every token once.
  return int(std::min(double(tokens), std::ceil(c.capacity_factor * double(tokens) * c.top_k / c.experts)));
}

std::vector<BufferSpec> moe_buffers(const MoeConfig& c, int tokens) {
  const std::int64_t N = tokens, E = c.experts, C = c.d_model, F = c.ffn, Fp = c.fc_out(),
                     slots = E * moe_capacity(c, tokens);
  // A rank's local experts take up to ep x capacity rows each: E x capacity
  // slots on every layout.
  const auto A = MemCategory::activations, W = MemCategory::workspace;
  const core::Precision P = c.precision;
  // The activations its backward reads are its own; the rest is scratch
  // only a running pass uses, shared by every MoE layer of the rank.
  const bool shared = true;
  return {
      {"moe router logits", N * E, A, P},
      {"moe rows sent", slots * C, W, P, shared},
      {"moe rows received", slots * C, W, P, shared},
      {"moe expert outputs (back)", slots * C, A, P},
      {"moe expert inputs", slots * C, A, P},
      {"moe expert hidden", slots * Fp, A, P},
      {"moe expert hidden (activated)", slots * F, A, P},
      {"moe expert outputs", slots * C, W, P, shared},
      {"moe d expert outputs", slots * C, W, P, shared},
      {"moe d expert hidden", slots * F, W, P, shared},
      {"moe d expert hidden (pre-activation)", slots * Fp, W, P, shared},
      {"moe d expert inputs", slots * C, W, P, shared},
      {"moe d router logits", N * E, W, P, shared},
  };
}

MoeLayer::MoeLayer(const MoeConfig& c, int tokens, core::MemoryTracker& tracker, ExpertSeam& ep, Scratch* scratch)
    : c_(c), ep_(&ep), N_(tokens), cap_(moe_capacity(c, tokens)), bufs_(tracker, scratch) {
  STRATA_CHECK(c.top_k >= 1 && c.top_k <= c.experts, "top_k {} of {} experts", c.top_k, c.experts);
  STRATA_CHECK(c.capacity_factor > 0, "capacity factor {}", c.capacity_factor);
  STRATA_CHECK(c.experts % ep_->size() == 0, "{} experts over ep {}", c.experts, ep_->size());
  El_ = c.experts / ep_->size();
  core::Ptr* ptrs[] = {&probs_, &send_, &recv_, &yback_, &xin_, &hpre_, &h_, &yout_, &dyout_, &dh_, &dhpre_, &dxin_,
                       &dlogits_};
  std::size_t i = 0;
  for (const auto& b : moe_buffers(c, tokens))
    *ptrs[i++] = b.shared ? bufs_.shared(b.name, b.numel, b.category, b.format)
                          : bufs_.add(b.name, b.numel, b.category, b.format);
  const std::size_t E = std::size_t(c.experts), slots = E * std::size_t(cap_);
  topk_.assign(std::size_t(N_) * c.top_k, 0);
  slot_.assign(std::size_t(N_) * c.top_k, -1);
  gate_.assign(std::size_t(N_) * c.top_k, 0.0f);
  tok_.assign(slots, -1);
  pos_.assign(E, 0);
  recv_count_.assign(E, 0);
  expert_rows_.assign(std::size_t(El_), 0);
  for (auto* v : {&out_counts_, &out_displs_, &in_counts_, &in_displs_}) v->assign(std::size_t(ep_->size()), 0);
}

void MoeLayer::exchange(core::CPtr send, core::Ptr recv, bool out) {
  // Out: this rank's rows to their experts' ranks; back: the reverse.
  auto* sc = &out_counts_, *sd = &out_displs_, *rc = &in_counts_, *rd = &in_displs_;
  if (!out) std::swap(sc, rc), std::swap(sd, rd);
  ep_->exchange(send, sc->data(), sd->data(), recv, rc->data(), rd->data(),
                std::int64_t(c_.experts) * cap_ * c_.d_model);
}

void MoeLayer::regroup(core::Ptr by_source, core::Ptr by_expert, bool to_experts) const {
  const int C = c_.d_model, P = ep_->size();
  std::int64_t row = 0;  // in the by-source order
  std::vector<int> done(std::size_t(El_), 0);
  for (int p = 0; p < P; ++p)
    for (int el = 0; el < El_; ++el) {
      const int n = recv_count_[std::size_t(p) * El_ + el];
      const core::Ptr e = by_expert + (std::int64_t(el) * P * cap_ + done[std::size_t(el)]) * C;
      const core::Ptr s = by_source + row * C;
      kernels::copy_bytes((to_experts ? e : s).get(), (to_experts ? s : e).get(),
                          std::size_t(n) * C * std::size_t(e.element_bytes()));
      done[std::size_t(el)] += n;
      row += n;
    }
}

float MoeLayer::forward(core::Ptr y, core::CPtr x, const MoeParams& p) {
  const int N = N_, C = c_.d_model, F = c_.ffn, E = c_.experts, K = c_.top_k;
  const std::int64_t Fp = c_.fc_out();
  // Router: logits = x W_r^T, then on the host a softmax per token (in
  // place), the top-k, the slots and the rows to send.
  linear_forward(probs_, x, p.router, nullptr, N, C, E);
  to_host(hprobs_, probs_, std::int64_t(N) * E);
  // The meta device routes as a balanced router does (below): it sizes no
  // probabilities and skips the softmax and the top-k, which the planner's
  // thousands of estimates of long sequences would otherwise spend most
  // time in.
  const bool meta = kernels::is_meta();
  float* probs = hprobs_.data();
  mass_.assign(std::size_t(E), 0.0);
  first_share_.assign(std::size_t(E), 0.0);
  for (int t = 0; !meta && t < N; ++t) {
    float* r = probs + std::int64_t(t) * E;
    const float m = *std::max_element(r, r + E);
    double s = 0;
    for (int e = 0; e < E; ++e) s += (r[e] = std::exp(r[e] - m));
    for (int e = 0; e < E; ++e) r[e] = float(r[e] / s);
  }
  // Top-k per token (ties to the lower index) and the gates.
  for (int t = 0; !meta && t < N; ++t) {
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
  if (meta) {
    // The meta device computes no logits (every token would tie, and go to
    // the first experts): a dry run routes as a balanced router does, token
    // t's j-th choice expert (t K + j) mod E, so the experts' work and the
    // exchange's bytes are the expected ones (the buffers do not depend on it).
    for (int t = 0; t < N; ++t)
      for (int j = 0; j < K; ++j) topk_[std::size_t(t) * K + j] = (t * K + j) % E;
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
  // Dispatch: the kept rows, expert after expert in slot order, to their
  // experts' ranks (counts first, so each rank knows what arrives).
  // The meta device (a dry run) moves no data: its copies are counted, and
  // the host's rows, which would hold nothing, are neither sized nor walked.
  const bool host = !kernels::is_meta();
  const int P = ep_->size();
  to_host(hrows_, x, std::int64_t(N) * C);
  if (host) hsend_.resize(std::size_t(E) * cap_ * C);
  int rows = 0;
  for (int e = 0; e < E; ++e) {
    pos_[std::size_t(e)] = rows;
    for (int s = 0; host && s < count_[std::size_t(e)]; ++s)
      std::copy_n(hrows_.data() + std::int64_t(tok_[std::size_t(e) * cap_ + s]) * C, C,
                  hsend_.data() + std::int64_t(rows + s) * C);
    rows += count_[std::size_t(e)];
  }
  from_host(send_, hsend_, std::int64_t(rows) * C);
  ep_->exchange_counts(count_.data(), recv_count_.data(), El_);
  std::int64_t out = 0, in = 0;
  std::fill(expert_rows_.begin(), expert_rows_.end(), 0);
  for (int p = 0; p < P; ++p) {
    std::int64_t o = 0, i = 0;
    for (int el = 0; el < El_; ++el) {
      o += count_[std::size_t(p) * El_ + el];
      i += recv_count_[std::size_t(p) * El_ + el];
      expert_rows_[std::size_t(el)] += recv_count_[std::size_t(p) * El_ + el];
    }
    out_displs_[std::size_t(p)] = out * C, out_counts_[std::size_t(p)] = o * C, out += o;
    in_displs_[std::size_t(p)] = in * C, in_counts_[std::size_t(p)] = i * C, in += i;
  }
  exchange(send_, recv_, true);
  regroup(recv_, xin_, true);
  // Each local expert's MLP over the rows every rank sent it.
  for (int el = 0; el < El_; ++el) {
    const int n = expert_rows_[std::size_t(el)];
    if (n == 0) continue;
    const std::int64_t base = std::int64_t(el) * P * cap_;
    const core::Ptr xin = xin_ + base * C, hpre = hpre_ + base * Fp, h = h_ + base * F, yout = yout_ + base * C;
    linear_forward(hpre, xin, p.fc_w + std::int64_t(el) * Fp * C, at(p.fc_b, el, Fp), n, C, int(Fp));
    activation_forward(c_.act, h, hpre, n, F);
    linear_forward(yout, h, p.proj_w + std::int64_t(el) * C * F, at(p.proj_b, el, C), n, F, C);
  }
  // Combine: the outputs back to the ranks their tokens came from, then
  // y[t] = sum over kept choices of gate x expert output.
  regroup(recv_, yout_, false);
  exchange(recv_, yback_, false);
  to_host(hyback_, yback_, std::int64_t(rows) * C);  // kept for the backward pass's gate gradients
  std::fill(hrows_.begin(), hrows_.end(), 0.0f);  // now the output
  for (int t = 0; host && t < N; ++t)
    for (int j = 0; j < K; ++j) {
      const int s = slot_[std::size_t(t) * K + j];
      if (s < 0) continue;
      const int e = topk_[std::size_t(t) * K + j];
      const float g = gate_[std::size_t(t) * K + j];
      const float* src = hyback_.data() + std::int64_t(pos_[std::size_t(e)] + s) * C;
      float* dst = hrows_.data() + std::int64_t(t) * C;
      for (int k = 0; k < C; ++k) dst[k] += g * src[k];
    }
  from_host(y, hrows_, std::int64_t(N) * C);
  double aux = 0;
  for (int e = 0; e < E; ++e) aux += first_share_[std::size_t(e)] * (mass_[std::size_t(e)] / N);
  aux_ = float(c_.aux_coef * E * aux);
  return aux_;
}

void MoeLayer::backward(core::Ptr dx, core::CPtr dy, core::CPtr x, const MoeParams& p, const MoeGrads& g,
                        float aux_scale) {
  const int N = N_, C = c_.d_model, F = c_.ffn, E = c_.experts, K = c_.top_k;
  const std::int64_t Fp = c_.fc_out();
  const int P = ep_->size();
  const float* probs = hprobs_.data();
  // On the host: d(gate) per choice, and each kept choice's output gradient
  // (gate x dy) into its row of the packed rows, sent to its expert's rank.
  // As in the forward pass, the meta device's copies are only counted.
  const bool host = !kernels::is_meta();
  to_host(hrows_, dy, std::int64_t(N) * C);
  std::vector<float> dgate(std::size_t(N) * K, 0.0f);
  int rows = 0;
  for (int e = 0; e < E; ++e) rows += count_[std::size_t(e)];
  for (int t = 0; host && t < N; ++t)
    for (int j = 0; j < K; ++j) {
      const int s = slot_[std::size_t(t) * K + j];
      if (s < 0) continue;
      const int e = topk_[std::size_t(t) * K + j];
      const float gt = gate_[std::size_t(t) * K + j];
      const float* d = hrows_.data() + std::int64_t(t) * C;
      const std::int64_t row = pos_[std::size_t(e)] + s;
      const float* out = hyback_.data() + row * C;
      float* dout = hsend_.data() + row * C;
      double dot = 0;
      for (int k = 0; k < C; ++k) {
        dout[k] = gt * d[k];
        dot += double(d[k]) * out[k];
      }
      dgate[std::size_t(t) * K + j] = float(dot);
    }
  from_host(send_, hsend_, std::int64_t(rows) * C);
  exchange(send_, recv_, true);
  regroup(recv_, dyout_, true);
  // The local experts: the MLP backward over their rows; the input
  // gradients go back to the ranks the rows came from and are scattered to
  // their tokens.
  for (int el = 0; el < El_; ++el) {
    const int n = expert_rows_[std::size_t(el)];
    if (n == 0) continue;
    const std::int64_t base = std::int64_t(el) * P * cap_;
    const core::CPtr xin = xin_ + base * C, hpre = hpre_ + base * Fp, h = h_ + base * F, dout = dyout_ + base * C;
    const core::Ptr dh = dh_ + base * F, dxin = dxin_ + base * C;
    linear_backward(dh, g.proj_w + std::int64_t(el) * C * F, at(g.proj_b, el, C), dout, h,
                    p.proj_w + std::int64_t(el) * C * F, n, F, C);
    // The activation's input gradient (the kernels accumulate: start from zero).
    const core::Ptr dpre = dhpre_ + base * Fp;
    kernels::fill_zero(dpre, std::int64_t(n) * Fp);
    activation_backward(c_.act, dpre, hpre, dh, n, F);
    linear_backward(dxin, g.fc_w + std::int64_t(el) * Fp * C, at(g.fc_b, el, Fp), dpre, xin,
                    p.fc_w + std::int64_t(el) * Fp * C, n, C, int(Fp));
  }
  regroup(recv_, dxin_, false);
  exchange(recv_, send_, false);
  // The rows' input gradients added to their tokens' (dx accumulates).
  to_host(hsend_, send_, std::int64_t(rows) * C);
  to_host(hrows_, dx, std::int64_t(N) * C);
  for (int e = 0; host && e < E; ++e)
    for (int s = 0; s < count_[std::size_t(e)]; ++s) {
      float* d = hrows_.data() + std::int64_t(tok_[std::size_t(e) * cap_ + s]) * C;
      const float* src = hsend_.data() + std::int64_t(pos_[std::size_t(e)] + s) * C;
      for (int k = 0; k < C; ++k) d[k] += src[k];
    }
  from_host(dx, hrows_, std::int64_t(N) * C);
  // Router: d(probs) from the gates (renormalised: g_j = p_j / S over the
  // top-k) and from the auxiliary loss (dL/dp[t, e] = coef E f_e / N, f
  // being counts), then the softmax backward and the router linear.
  // (On the meta device only the copy is counted, as above.)
  std::vector<float> dlogits(host ? std::size_t(N) * E : 0);  // on the host, then to dlogits_
  const double aux_grad = double(aux_scale) * c_.aux_coef * E / N;
  std::vector<double> dp(static_cast<std::size_t>(E));  // one token's d(probs)
  for (int t = 0; host && t < N; ++t) {
    const float* r = probs + std::int64_t(t) * E;
    const int* top = topk_.data() + std::int64_t(t) * K;
    const float* dg = dgate.data() + std::int64_t(t) * K;
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
  from_host(dlogits_, dlogits, std::int64_t(N) * E);
  linear_backward(dx, g.router, nullptr, dlogits_, x, p.router, N, C, E, /*accumulate_dinp=*/true);
}

}  // namespace strata::models
