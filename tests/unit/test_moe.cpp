// The Mixture-of-Experts layer against a double-precision reference written
// from the definitions (router softmax, top-k, renormalised gates, capacity
// filled choice by choice, expert MLPs, the Switch/GShard auxiliary loss),
// and its backward pass against central differences of that reference, on
// fresh random inputs; and the routing rules themselves.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "models/decoder/decoder.hpp"
#include "models/moe.hpp"
#include "models/state.hpp"

using namespace strata;

namespace {

struct Weights {
  std::vector<double> router, fc_w, fc_b, proj_w, proj_b;
};

double gelu(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

struct RefOut {
  std::vector<double> y;
  double aux = 0;
  std::vector<int> choice, slot;  // [N, k]
  int dropped = 0;
};

// The layer from its definition, in double.
RefOut reference(const models::MoeConfig& c, int N, const std::vector<double>& x, const Weights& w) {
  const int C = c.d_model, F = c.ffn, E = c.experts, K = c.top_k;
  const int cap = models::moe_capacity(c, N);
  RefOut o;
  o.y.assign(std::size_t(N) * C, 0.0);
  o.choice.assign(std::size_t(N) * K, -1);
  o.slot.assign(std::size_t(N) * K, -1);
  std::vector<double> p(std::size_t(N) * E), gate(std::size_t(N) * K);
  std::vector<double> f(std::size_t(E), 0.0), P(std::size_t(E), 0.0);
  for (int t = 0; t < N; ++t) {
    std::vector<double> z(static_cast<std::size_t>(E));
    for (int e = 0; e < E; ++e)
      for (int k = 0; k < C; ++k) z[std::size_t(e)] += x[std::size_t(t) * C + k] * w.router[std::size_t(e) * C + k];
    const double m = *std::max_element(z.begin(), z.end());
    double s = 0;
    for (int e = 0; e < E; ++e) s += std::exp(z[std::size_t(e)] - m);
    for (int e = 0; e < E; ++e) p[std::size_t(t) * E + e] = std::exp(z[std::size_t(e)] - m) / s;
    std::vector<int> order(static_cast<std::size_t>(E));
    for (int e = 0; e < E; ++e) order[std::size_t(e)] = e;
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return p[std::size_t(t) * E + a] > p[std::size_t(t) * E + b]; });
    double S = 0;
    for (int j = 0; j < K; ++j) S += p[std::size_t(t) * E + order[std::size_t(j)]];
    for (int j = 0; j < K; ++j) {
      const double pj = p[std::size_t(t) * E + order[std::size_t(j)]];
      o.choice[std::size_t(t) * K + j] = order[std::size_t(j)];
      gate[std::size_t(t) * K + j] = c.renormalize ? pj / S : pj;
    }
    f[std::size_t(order[0])] += 1.0 / N;
    for (int e = 0; e < E; ++e) P[std::size_t(e)] += p[std::size_t(t) * E + e] / N;
  }
  std::vector<int> count(std::size_t(E), 0);
  for (int j = 0; j < K; ++j)
    for (int t = 0; t < N; ++t) {
      const int e = o.choice[std::size_t(t) * K + j];
      if (count[std::size_t(e)] < cap) o.slot[std::size_t(t) * K + j] = count[std::size_t(e)]++;
      else ++o.dropped;
    }
  for (int t = 0; t < N; ++t)
    for (int j = 0; j < K; ++j) {
      if (o.slot[std::size_t(t) * K + j] < 0) continue;
      const int e = o.choice[std::size_t(t) * K + j];
      std::vector<double> h(static_cast<std::size_t>(F));
      for (int i = 0; i < F; ++i) {
        double a = w.fc_b[std::size_t(e) * F + i];
        for (int k = 0; k < C; ++k) a += x[std::size_t(t) * C + k] * w.fc_w[(std::size_t(e) * F + i) * C + k];
        h[std::size_t(i)] = gelu(a);
      }
      for (int k = 0; k < C; ++k) {
        double a = w.proj_b[std::size_t(e) * C + k];
        for (int i = 0; i < F; ++i) a += h[std::size_t(i)] * w.proj_w[(std::size_t(e) * C + k) * F + i];
        o.y[std::size_t(t) * C + k] += gate[std::size_t(t) * K + j] * a;
      }
    }
  for (int e = 0; e < E; ++e) o.aux += f[std::size_t(e)] * P[std::size_t(e)];
  o.aux *= double(c.aux_coef) * E;
  return o;
}

std::vector<double> randn(std::mt19937& rng, std::size_t n, double std) {
  std::normal_distribution<double> d(0, std);
  std::vector<double> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<float> to_f(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

struct Case {
  models::MoeConfig c;
  int N;
};

void check_case(const Case& cs, unsigned seed) {
  const auto& c = cs.c;
  const int N = cs.N, C = c.d_model, F = c.ffn, E = c.experts;
  SCOPED_TRACE(::testing::Message() << "E " << E << " k " << c.top_k << " drop " << c.drop_tokens << " renorm "
                                    << c.renormalize << " seed " << seed);
  std::mt19937 rng(seed);
  Weights w{randn(rng, std::size_t(E) * C, 0.5), randn(rng, std::size_t(E) * F * C, 0.3),
            randn(rng, std::size_t(E) * F, 0.1), randn(rng, std::size_t(E) * C * F, 0.3),
            randn(rng, std::size_t(E) * C, 0.1)};
  const std::vector<double> x = randn(rng, std::size_t(N) * C, 1.0), R = randn(rng, std::size_t(N) * C, 1.0);
  const RefOut ref = reference(c, N, x, w);

  core::MemoryTracker tracker;
  models::MoeLayer layer(c, N, tracker);
  const auto fr = to_f(w.router), ffw = to_f(w.fc_w), ffb = to_f(w.fc_b), fpw = to_f(w.proj_w), fpb = to_f(w.proj_b);
  const auto fx = to_f(x), fR = to_f(R);
  const models::MoeParams p{fr.data(), ffw.data(), ffb.data(), fpw.data(), fpb.data()};
  std::vector<float> y(std::size_t(N) * C);
  const float aux = layer.forward(y.data(), fx.data(), p);
  // Forward: same routing, outputs and auxiliary loss.
  EXPECT_EQ(layer.choices(), ref.choice);
  EXPECT_EQ(layer.slots(), ref.slot);
  EXPECT_EQ(layer.dropped(), ref.dropped);
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    err = std::max(err, std::fabs(y[i] - ref.y[i]));
    scale = std::max(scale, std::fabs(ref.y[i]));
  }
  EXPECT_LE(err, 1e-5 * std::max(scale, 1.0));
  EXPECT_NEAR(aux, ref.aux, 1e-6 * std::max(1.0, std::fabs(ref.aux)));

  // Backward of L = sum(y * R) + aux (aux_scale 1), against central
  // differences of the reference. Routing is piecewise constant: an element
  // whose +-h moves a token across a routing boundary is left out (counted).
  std::vector<float> gr(fr.size()), gfw(ffw.size()), gfb(ffb.size()), gpw(fpw.size()), gpb(fpb.size()),
      dx(fx.size(), 0.0f);
  const models::MoeGrads g{gr.data(), gfw.data(), gfb.data(), gpw.data(), gpb.data()};
  layer.backward(dx.data(), fR.data(), fx.data(), p, g, 1.0f);
  auto loss = [&](const std::vector<double>& xx, const Weights& ww, RefOut* out) {
    *out = reference(c, N, xx, ww);
    double l = out->aux;
    for (std::size_t i = 0; i < out->y.size(); ++i) l += out->y[i] * R[i];
    return l;
  };
  const double h = 1e-5;
  int checked = 0, crossings = 0;
  auto check = [&](std::vector<double>& v, const std::vector<float>& analytic, const char* what, int stride,
                   std::vector<double>* xx, Weights* ww) {
    for (std::size_t i = 0; i < v.size(); i += std::size_t(stride)) {
      const double keep = v[i];
      RefOut a, b;
      v[i] = keep + h;
      const double lp = loss(*xx, *ww, &a);
      v[i] = keep - h;
      const double lm = loss(*xx, *ww, &b);
      v[i] = keep;
      if (a.choice != ref.choice || a.slot != ref.slot || b.choice != ref.choice || b.slot != ref.slot) {
        ++crossings;
        continue;
      }
      const double fd = (lp - lm) / (2 * h);
      EXPECT_NEAR(analytic[i], fd, 2e-3 * std::max(1.0, std::fabs(fd))) << what << "[" << i << "]";
      ++checked;
    }
  };
  std::vector<double> xx = x;
  Weights ww = w;
  check(ww.router, gr, "router", 1, &xx, &ww);
  check(ww.fc_w, gfw, "fc_w", 7, &xx, &ww);
  check(ww.fc_b, gfb, "fc_b", 3, &xx, &ww);
  check(ww.proj_w, gpw, "proj_w", 7, &xx, &ww);
  check(ww.proj_b, gpb, "proj_b", 1, &xx, &ww);
  check(xx, dx, "x", 1, &xx, &ww);
  EXPECT_GT(checked, 100);
  EXPECT_LT(crossings, checked / 10);
}

}  // namespace

TEST(Moe, ForwardAndBackwardMatchTheReference) {
  const unsigned seed = std::random_device{}();
  std::vector<Case> cases;
  for (int k : {1, 2})
    for (bool drop : {true, false})
      for (bool renorm : {true, false}) {
        models::MoeConfig c;
        c.d_model = 8;
        c.ffn = 12;
        c.experts = 4;
        c.top_k = k;
        c.capacity_factor = 1.0;
        c.drop_tokens = drop;
        c.renormalize = renorm;
        c.aux_coef = 0.1f;
        cases.push_back({c, 24});
      }
  for (std::size_t i = 0; i < cases.size(); ++i) check_case(cases[i], seed + unsigned(i));
}

TEST(Moe, CapacityAndDroppingFollowTheRules) {
  models::MoeConfig c;
  c.experts = 4;
  c.top_k = 2;
  c.capacity_factor = 1.25;
  EXPECT_EQ(models::moe_capacity(c, 16), 10);  // ceil(1.25 x 16 x 2 / 4)
  c.capacity_factor = 0.1;
  EXPECT_EQ(models::moe_capacity(c, 16), 1);
  c.drop_tokens = false;
  EXPECT_EQ(models::moe_capacity(c, 16), 16);
  c.drop_tokens = true;
  // Every token prefers expert 0 (a router that sees only the first
  // channel), then expert 1: with capacity 2, tokens 0 and 1 keep expert 0,
  // tokens 0 and 1 keep expert 1 (second choices come after all first ones),
  // and everything else is dropped.
  c.d_model = 2;
  c.ffn = 2;
  c.top_k = 2;
  c.capacity_factor = 1.0;  // ceil(1 x 4 x 2 / 4) = 2
  const int N = 4;
  core::MemoryTracker tracker;
  models::MoeLayer layer(c, N, tracker);
  const std::vector<float> router = {4, 0, 2, 0, 0, 0, -2, 0};  // logits 4x, 2x, 0, -2x for x = channel 0
  const std::vector<float> fw(std::size_t(4) * 2 * 2, 0.1f), fb(8, 0.0f), pw(16, 0.1f), pb(8, 0.0f);
  const std::vector<float> x = {1, 0, 1, 0, 1, 0, 1, 0};
  std::vector<float> y(8);
  const float aux = layer.forward(y.data(), x.data(), {router.data(), fw.data(), fb.data(), pw.data(), pb.data()});
  EXPECT_EQ(layer.capacity(), 2);
  EXPECT_EQ(layer.routed(), (std::vector<int>{4, 4, 0, 0}));
  EXPECT_EQ(layer.kept(), (std::vector<int>{2, 2, 0, 0}));
  EXPECT_EQ(layer.dropped(), 4);
  EXPECT_EQ(layer.slots(), (std::vector<int>{0, 0, 1, 1, -1, -1, -1, -1}));
  // Tokens 2 and 3 lost both choices: their MoE output is zero.
  for (int k = 4; k < 8; ++k) EXPECT_EQ(y[std::size_t(k)], 0.0f);
  // aux = coef x E x sum f_e P_e with f = (1, 0, 0, 0): coef x 4 x P_0.
  const double z[4] = {4, 2, 0, -2};
  double s = 0;
  for (double v : z) s += std::exp(v);
  EXPECT_NEAR(aux, c.aux_coef * 4 * std::exp(4.0) / s, 1e-6);
}

// Perfectly balanced routing gives the auxiliary loss its minimum, the coefficient.
TEST(Moe, AuxiliaryLossOfUniformRoutingIsTheCoefficient) {
  models::MoeConfig c;
  c.d_model = 4;
  c.ffn = 4;
  c.experts = 4;
  c.top_k = 1;
  c.aux_coef = 0.25f;
  const int N = 4;
  core::MemoryTracker tracker;
  models::MoeLayer layer(c, N, tracker);
  // Router = identity on 4 channels, token t = one-hot(t) x 20: token t
  // goes to expert t with probability ~1.
  std::vector<float> router(16, 0.0f), x(16, 0.0f);
  for (int i = 0; i < 4; ++i) router[std::size_t(i) * 4 + i] = 1, x[std::size_t(i) * 4 + i] = 20;
  const std::vector<float> fw(64, 0.0f), fb(16, 0.0f), pw(64, 0.0f), pb(16, 0.0f);
  std::vector<float> y(16);
  const float aux = layer.forward(y.data(), x.data(), {router.data(), fw.data(), fb.data(), pw.data(), pb.data()});
  EXPECT_EQ(layer.kept(), (std::vector<int>{1, 1, 1, 1}));
  EXPECT_NEAR(aux, 0.25, 1e-6);
}

// A MoE GPT with one expert, top-1, renormalised gates and no capacity limit
// is the dense GPT: same weights (the expert copied from the dense MLP), the
// same loss plus the auxiliary loss (coef x 1 x 1 x 1 per MoE block), the
// same gradients, and a router that gets none (its softmax is constant).
TEST(Moe, OneExpertGptIsTheDenseGpt) {
  models::DecoderConfig dense{3, 8, 2, 4, 16, 6};
  models::DecoderConfig moe = dense;
  moe.moe = models::MoeBlocks{1, 2, 1, 1.0, false, true, 0.05f};  // blocks 1 only (every 2nd)
  ASSERT_FALSE(moe.is_moe(0));
  ASSERT_TRUE(moe.is_moe(1));
  ASSERT_FALSE(moe.is_moe(2));
  const int B = 2, T = 6;
  core::MemoryTracker tracker;
  models::Decoder gd(dense, B, tracker), gm(moe, B, tracker);
  models::ReplicatedState sd(gd.registry(), gd.units(), tracker, 7), sm(gm.registry(), gm.units(), tracker, 7);
  auto moe_name = [](const std::string& n) {
    for (const char* part : {"fc.weight", "fc.bias", "proj.weight", "proj.bias"})
      if (n.ends_with(std::string("mlp.") + part) && n.rfind("h.1.", 0) == 0)
        return n.substr(0, n.size() - std::string("mlp.").size() - std::string(part).size()) + "moe.experts." + part;
    return n;
  };
  for (const auto& s : gd.registry().specs()) {
    const auto& t = gm.registry().find(moe_name(s.name));
    ASSERT_EQ(t.numel, s.numel) << s.name;
    std::copy(sd.params() + s.offset, sd.params() + s.offset + s.numel, sm.params() + t.offset);
  }
  std::mt19937 rng(3);
  std::vector<std::int32_t> tokens(std::size_t(B) * T), targets(std::size_t(B) * T);
  for (auto& v : tokens) v = std::int32_t(rng() % 16);
  for (auto& v : targets) v = std::int32_t(rng() % 16);
  const float ld = gd.forward(sd, tokens.data(), targets.data());
  const float lm = gm.forward(sm, tokens.data(), targets.data());
  EXPECT_NEAR(lm, ld + 0.05f, 1e-6);
  gd.backward(sd, tokens.data(), targets.data(), 1.0f);
  gm.backward(sm, tokens.data(), targets.data(), 1.0f);
  for (const auto& s : gd.registry().specs()) {
    const auto& t = gm.registry().find(moe_name(s.name));
    double err = 0, scale = 0;
    for (std::int64_t i = 0; i < s.numel; ++i) {
      err = std::max(err, double(std::fabs(sm.grads()[t.offset + i] - sd.grads()[s.offset + i])));
      scale = std::max(scale, double(std::fabs(sd.grads()[s.offset + i])));
    }
    EXPECT_LE(err, 1e-5 * std::max(scale, 1e-3)) << s.name;
  }
  const auto& router = gm.registry().find("h.1.moe.router.weight");
  for (std::int64_t i = 0; i < router.numel; ++i) EXPECT_NEAR(sm.grads()[router.offset + i], 0.0f, 1e-7);
  ASSERT_NE(gm.moe_layer(1), nullptr);
  EXPECT_EQ(gm.moe_layer(1)->kept(), (std::vector<int>{B * T}));
  EXPECT_EQ(gm.moe_layer(0), nullptr);
}
