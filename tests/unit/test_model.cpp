// The GPT model's bookkeeping: parameter count, exact memory accounting, the
// FLOP count against Megatron's formula, layout-independent initialisation,
// and the optimizer's state size. Numerical correctness of the model as a
// whole is the PyTorch parity test's job (tests/python).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>

#include "models/decoder/decoder.hpp"
#include "models/init.hpp"
#include "models/optimizer.hpp"
#include "kernels/foundation/error.hpp"

using namespace strata;
using core::MemCategory;

namespace {

models::DecoderConfig cfg(int L, int C, int NH, int V, int T, int fm = 4) {
  return models::DecoderConfig{L, C, NH, fm, V, T};
}

// Parameters of a GPT-2 layout with tied head, counted by hand.
std::int64_t analytic_params(const models::DecoderConfig& c) {
  const std::int64_t C = c.d_model, F = c.ffn(), V = c.vocab, T = c.seq_len, L = c.layers;
  const std::int64_t block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (F * C + F) + (C * F + C);
  return V * C + T * C + L * block + 2 * C;
}

}  // namespace

TEST(Model, ParameterCountMatchesFormula) {
  for (auto c : {cfg(1, 8, 2, 11, 5), cfg(3, 24, 4, 37, 9, 3), cfg(4, 256, 4, 256, 128)}) {
    EXPECT_EQ(models::decoder_registry(c).numel(), analytic_params(c));
  }
}

TEST(Model, RegistryViewsAreContiguousAndDisjoint) {
  const auto r = models::decoder_registry(cfg(2, 16, 4, 23, 7));
  std::int64_t expect = 0;
  for (const auto& s : r.specs()) {
    EXPECT_EQ(s.offset, expect) << s.name;
    std::int64_t n = 1;
    for (auto d : s.shape) n *= d;
    EXPECT_EQ(n, s.numel) << s.name;
    expect += s.numel;
  }
  EXPECT_EQ(expect, r.numel());
  EXPECT_THROW(r.find("h.9.ln1.weight"), core::Error);
}

// Params 4 Psi, grads 4 Psi, AdamW state 8 Psi bytes exactly; activations and
// workspace exactly the buffers the model lists (what the dry run's
// estimate measures), the activations those of GPT-2's forward.
TEST(Model, MemoryAccountingIsExact) {
  const auto c = cfg(2, 32, 4, 61, 12);
  const int B = 3;
  core::MemoryTracker tracker;
  models::Decoder m(c, B, tracker);
  models::ReplicatedState st(m.registry(), m.units(), tracker, 1);
  models::AdamW opt(m.registry(), 0, m.registry().numel(), {}, tracker);
  const std::uint64_t psi = std::uint64_t(analytic_params(c));
  EXPECT_EQ(tracker.current(MemCategory::params), 4 * psi);
  EXPECT_EQ(tracker.current(MemCategory::grads), 4 * psi);
  EXPECT_EQ(tracker.current(MemCategory::optimizer), 8 * psi);
  std::uint64_t act = 0, ws = 0;
  for (const auto& b : m.buffers())
    (b.category == MemCategory::activations ? act : ws) += 4 * std::uint64_t(b.numel);
  EXPECT_EQ(tracker.current(MemCategory::activations), act);
  EXPECT_EQ(tracker.current(MemCategory::workspace), ws);
  EXPECT_EQ(tracker.current(MemCategory::comm), 0u);
  // The stage input; per block ln1, qkv, attention's output, res2, ln2 (N x
  // C, 3C, C, C, C), the two norms' mean and rstd (4 N), the attention
  // probabilities (B NH T T), the MLP hidden before and after GELU (2 N F)
  // and the block's output (N C); the head's norm (N C, 2 N), logits (N V)
  // and its loss, row maximum, sum and target logit (4 N).
  const std::uint64_t N = std::uint64_t(B) * c.seq_len, C = c.d_model, F = c.ffn(), V = c.vocab;
  const std::uint64_t block = 7 * N * C + 4 * N + std::uint64_t(B) * c.heads * c.seq_len * c.seq_len + 2 * N * F + N * C;
  EXPECT_EQ(act, 4 * (N * C + std::uint64_t(c.layers) * block + N * C + 2 * N + N * V + 4 * N));
}

TEST(Model, MemoryLimitRefusesWithBreakdown) {
  core::MemoryTracker tracker(1000);
  try {
    models::Decoder m(cfg(2, 32, 4, 61, 12), 2, tracker);
    models::ReplicatedState st(m.registry(), m.units(), tracker, 1);
    FAIL() << "expected an out-of-memory error";
  } catch (const core::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("backend.memory_limit"), std::string::npos) << msg;
    EXPECT_NE(msg.find("params"), std::string::npos) << msg;
    EXPECT_EQ(e.exit_code(), 1);
  }
  EXPECT_EQ(tracker.total_current(), 0u);  // nothing leaked by the failed construction
}

// Megatron (Narayanan et al. 2021): 72 B s l h^2 (1 + s / 6h + V / 12 h l).
TEST(Model, FlopsEqualMegatronFormula) {
  for (auto c : {cfg(4, 256, 4, 256, 128), cfg(24, 1024, 16, 50304, 2048), cfg(3, 40, 5, 97, 33)}) {
    for (int B : {1, 8}) {
      const double h = c.d_model, s = c.seq_len, l = c.layers, V = c.vocab;
      const double megatron = 72.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * h * l));
      EXPECT_NEAR(models::decoder_model_flops(c, B) / megatron, 1.0, 1e-12);
    }
  }
}

// Any slice of a parameter initialised alone equals the same slice of the
// whole: what lets a sharded layout build identical weights.
TEST(Model, InitialisationIsKeyedByNameAndIndex) {
  const auto r = models::decoder_registry(cfg(2, 16, 4, 23, 7));
  const auto& w = r.find("h.1.mlp.fc.weight");
  std::vector<float> full(w.numel), part(w.numel);
  models::init_param(full.data(), w, 42, 0, w.numel);
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 5; ++trial) {
    const std::int64_t lo = rng() % w.numel, n = 1 + rng() % (w.numel - lo);
    models::init_param(part.data(), w, 42, lo, n);
    for (std::int64_t k = 0; k < n; ++k) ASSERT_EQ(part[k], full[lo + k]);
  }
  // A different name or seed gives different numbers; the scale is the one asked for.
  std::vector<float> other(w.numel);
  models::init_param(other.data(), r.find("h.0.mlp.fc.weight"), 42, 0, w.numel);
  EXPECT_NE(other[0], full[0]);
  double sum = 0, sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = models::keyed_normal(3, 99, i);
    sum += x;
    sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(sq / n), 1.0, 0.01);
}

TEST(Model, InitialisingAnyRangeMatchesTheWhole) {
  const auto r = models::decoder_registry(cfg(2, 16, 4, 23, 7));
  std::vector<float> whole(r.numel()), part(r.numel());
  models::init_flat_range(r, 5, 0, r.numel(), whole.data());
  // Ranges that cut through parameters, as shards do.
  const std::int64_t cuts[] = {0, 7, 1000, 1001, r.numel() / 2, r.numel()};
  for (int k = 0; k + 1 < 6; ++k) models::init_flat_range(r, 5, cuts[k], cuts[k + 1], part.data() + cuts[k]);
  for (std::int64_t i = 0; i < r.numel(); ++i) ASSERT_EQ(whole[i], part[i]) << i;
}

// Balanced stages, or the first and last stage fixed and the rest even.
TEST(Model, StageBlockCounts) {
  EXPECT_EQ(models::stage_block_counts(8, 4), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(models::stage_block_counts(6, 4, 0, 2), (std::vector<int>{0, 2, 2, 2}));
  EXPECT_EQ(models::stage_block_counts(7, 3, 1, -1), (std::vector<int>{1, 3, 3}));
  EXPECT_EQ(models::stage_block_counts(4, 2, 4, 0), (std::vector<int>{4, 0}));
  EXPECT_THROW(models::stage_block_counts(7, 4), core::Error);
  EXPECT_THROW(models::stage_block_counts(6, 4, 1, -1), core::Error);  // 5 over 3
  EXPECT_THROW(models::stage_block_counts(4, 3, 2, 2), core::Error);   // nothing for the middle
  const auto c = cfg(6, 16, 4, 23, 7);
  const models::Stage s = models::stage_of(c.layers, 1, 4, 0, 2);
  EXPECT_EQ(s.first, 0);
  EXPECT_EQ(s.last, 2);
  EXPECT_FALSE(s.embedding || s.head);
}

TEST(Model, UnitsTileTheFlatBuffer) {
  const auto r = models::decoder_registry(cfg(3, 16, 4, 23, 7));
  const auto u = models::decoder_units(r, cfg(3, 16, 4, 23, 7));
  ASSERT_EQ(u.size(), 6u);  // wte, wpe, 3 blocks, final norm
  EXPECT_EQ(u.front().begin, 0);
  EXPECT_EQ(u.back().end, r.numel());
  for (std::size_t i = 1; i < u.size(); ++i) EXPECT_EQ(u[i].begin, u[i - 1].end);
  EXPECT_EQ(u[0].end, r.find("wpe").offset);
  EXPECT_EQ(u[1].end, r.find("h.0.ln1.weight").offset);
  // A last pipeline stage: blocks, the final norm, then the tied wte copy
  // alone, so it shards like the first stage's wte.
  const models::Stage last{2, 3, false, true};
  const auto rl = models::decoder_registry(cfg(3, 16, 4, 23, 7), 1, 0, last);
  const auto ul = models::decoder_units(rl, cfg(3, 16, 4, 23, 7), last);
  ASSERT_EQ(ul.size(), 3u);
  EXPECT_EQ(ul[2].size(), u[0].size());
  EXPECT_EQ(ul[2].begin, rl.find("wte").offset);
}

// The optimizer's range hook: updating [begin, end) in two halves is the same
// as updating the whole buffer at once (what ZeRO's shards will rely on).
TEST(Model, AdamWOverSlicesEqualsWhole) {
  const auto c = cfg(1, 8, 2, 11, 5);
  core::MemoryTracker tracker;
  models::Decoder m(c, 1, tracker);
  models::ReplicatedState st(m.registry(), m.units(), tracker, 3);
  const auto& r = m.registry();
  const std::int64_t n = r.numel(), half = n / 2 + 3;
  std::vector<float> p1(st.params(), st.params() + n), p2 = p1, g(n);
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> nd;
  for (auto& x : g) x = nd(rng);
  models::AdamWSettings s{0.9f, 0.95f, 1e-8f, 0.1f};
  models::AdamW whole(r, 0, n, s, tracker), lo(r, 0, half, s, tracker), hi(r, half, n, s, tracker);
  for (int step = 1; step <= 3; ++step) {
    whole.update(p1.data(), g.data(), 1.0f, 1e-2f, step);
    lo.update(p2.data(), g.data(), 1.0f, 1e-2f, step);
    hi.update(p2.data() + half, g.data() + half, 1.0f, 1e-2f, step);
  }
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(p1[i], p2[i]) << i;
  // Decay applies to matrices only: a LayerNorm gain with zero gradient stays 1.
  std::vector<float> p3(st.params(), st.params() + n), zero(n, 0.0f);
  models::AdamW d(r, 0, n, s, tracker);
  d.update(p3.data(), zero.data(), 1.0f, 1e-1f, 1);
  EXPECT_EQ(p3[r.find("h.0.ln1.weight").offset], 1.0f);
  EXPECT_LT(std::fabs(p3[r.find("wte").offset]), std::fabs(st.params()[r.find("wte").offset]));
}

// Pipeline stages: the model cut into balanced stages and run one stage after
// the other, activations handed forward and their gradients back, computes
// the same loss and the same gradients as the whole model, bit for bit (the
// same kernels on the same data). The tied wte's gradient is the sum of the
// first stage's (embedding) and the last stage's copy (head), to rounding.
TEST(Model, StagesComposeToTheWholeModel) {
  const auto c = cfg(4, 16, 4, 29, 8);
  const int B = 2, N = B * c.seq_len;
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "token seed " << seed);
  std::mt19937 rng(seed);
  std::vector<std::int32_t> tok(N), tgt(N);
  for (int i = 0; i < N; ++i) tok[i] = std::int32_t(rng() % c.vocab), tgt[i] = std::int32_t(rng() % c.vocab);

  core::MemoryTracker tw;
  models::Decoder whole(c, B, tw);
  models::ReplicatedState sw(whole.registry(), whole.units(), tw, 9);
  const float loss = whole.forward(sw, tok.data(), tgt.data());
  whole.backward(sw, tok.data(), tgt.data(), 1.0f);

  for (int S : {2, 4}) {
    SCOPED_TRACE(::testing::Message() << S << " stages");
    core::MemoryTracker ts;
    std::vector<std::unique_ptr<models::Decoder>> stage;
    std::vector<std::unique_ptr<models::ReplicatedState>> state;
    for (int s = 0; s < S; ++s) {
      stage.push_back(std::make_unique<models::Decoder>(c, B, ts, models::Seams{}, models::stage_of(c.layers, s, S)));
      state.push_back(std::make_unique<models::ReplicatedState>(stage[s]->registry(), stage[s]->units(), ts, 9));
    }
    const std::size_t NC = std::size_t(N) * c.d_model;
    float staged_loss = 0;
    for (int s = 0; s < S; ++s) {
      if (s > 0) std::copy_n(stage[s - 1]->output().f32(), NC, stage[s]->input().f32());
      staged_loss = stage[s]->forward(*state[s], tok.data(), tgt.data());
    }
    EXPECT_EQ(staged_loss, loss);
    for (int s = S - 1; s >= 0; --s) {
      if (s < S - 1)
        std::copy_n(stage[s + 1]->input_grad().f32(), NC, stage[s]->output_grad().f32());
      stage[s]->backward(*state[s], tok.data(), tgt.data(), 1.0f);
    }
    // Every parameter of every stage: its values and gradients are the whole
    // model's (the wte copy's gradient adds to the first stage's).
    const auto& wr = whole.registry();
    std::vector<float> wte_sum(std::size_t(wr.find("wte").numel), 0.0f);
    for (int s = 0; s < S; ++s)
      for (const auto& p : stage[s]->registry().specs()) {
        const auto& w = wr.find(p.name);
        for (std::int64_t k = 0; k < p.numel; ++k) ASSERT_EQ(state[s]->params()[p.offset + k], sw.params()[w.offset + k]);
        if (p.name == "wte") {
          for (std::int64_t k = 0; k < p.numel; ++k) wte_sum[k] += state[s]->grads()[p.offset + k];
          continue;
        }
        for (std::int64_t k = 0; k < p.numel; ++k)
          ASSERT_EQ(state[s]->grads()[p.offset + k], sw.grads()[w.offset + k]) << p.name << "[" << k << "]";
      }
    // The one sum the stages associate differently: the whole model adds the
    // embedding's token rows one by one onto the head's gradient, the stages
    // add the head's onto the embedding's sum. The terms can cancel, so the
    // rounding is bounded by the size of the terms, not of the result: the
    // kernel tests' bound (1e-5 relative, floor 1e-6 of the largest value).
    const float* want = sw.grads() + wr.find("wte").offset;
    float scale = 0;
    for (std::size_t k = 0; k < wte_sum.size(); ++k) scale = std::max(scale, std::fabs(want[k]));
    for (std::size_t k = 0; k < wte_sum.size(); ++k)
      ASSERT_NEAR(wte_sum[k], want[k], 1e-5f * std::fabs(want[k]) + 1e-6f * scale) << k;
    // The first stage holds the embedding and no head; the last, the head and a wte copy.
    EXPECT_NO_THROW(stage[0]->registry().find("wpe"));
    EXPECT_THROW(stage[0]->registry().find("lnf.weight"), core::Error);
    EXPECT_NO_THROW(stage[S - 1]->registry().find("wte"));
    EXPECT_THROW(stage[S - 1]->registry().find("wpe"), core::Error);
  }
}

// model.attention = "unfused" on the CUDA backend composes batched products
// around the causal softmax (kernels/unfused_attention.hpp); on the CPU the
// model runs the composition as it runs its own attention operation: the
// same loss and gradients to fp32 rounding, for multi-head and grouped-query
// attention with rotary positions, kept and (selective) rebuilt.
TEST(Model, ComposedUnfusedAttentionTrainsAsTheCpusOwn) {
  auto gqa = cfg(2, 32, 4, 29, 12);
  gqa.kv_heads = 2, gqa.rope_theta = 10000, gqa.norm = models::Norm::rms, gqa.act = models::Activation::swiglu;
  gqa.bias = false, gqa.tie_embeddings = false;
  for (auto c : {cfg(2, 16, 4, 29, 12), gqa})
    for (const auto mode : {models::Recompute::none, models::Recompute::selective}) {
      c.recompute = mode;
      const int B = 2, N = B * c.seq_len;
      std::mt19937 rng(7);
      std::vector<std::int32_t> tok(N), tgt(N);
      for (int i = 0; i < N; ++i) tok[i] = std::int32_t(rng() % c.vocab), tgt[i] = std::int32_t(rng() % c.vocab);
      auto run = [&](bool composed, std::vector<float>* grads) {
        auto k = c;
        k.composed_attention = composed;
        core::MemoryTracker t;
        models::Decoder m(k, B, t);
        models::ReplicatedState st(m.registry(), m.units(), t, 9);
        const float loss = m.forward(st, tok.data(), tgt.data());
        m.backward(st, tok.data(), tgt.data(), 1.0f);
        grads->assign(st.grads(), st.grads() + m.registry().numel());
        return loss;
      };
      std::vector<float> own, composed;
      const float a = run(false, &own), b = run(true, &composed);
      EXPECT_NEAR(b, a, 1e-6f * std::fabs(a)) << "kv " << c.kv() << " recompute " << int(mode);
      float scale = 0;
      for (float g : own) scale = std::max(scale, std::fabs(g));
      for (std::size_t i = 0; i < own.size(); ++i)
        ASSERT_NEAR(composed[i], own[i], 1e-5f * scale) << i << " kv " << c.kv() << " recompute " << int(mode);
    }
}

// The closed-form count the deck checks sizes with is the registry's count,
// for dense models and for MoE ones with every placement of the MoE blocks.
TEST(Gpt, ParamCountIsTheRegistrysCount) {
  for (int layers : {1, 2, 5})
    for (int experts : {0, 3})
      for (int every : {1, 2, 3}) {
        models::DecoderConfig c;
        c.layers = layers, c.d_model = 12, c.heads = 3, c.ffn_mult = 3, c.vocab = 37, c.seq_len = 9;
        c.moe.experts = experts, c.moe.every = every;
        EXPECT_EQ(models::decoder_param_count(c), (long double)models::decoder_registry(c).numel())
            << "layers " << layers << " experts " << experts << " every " << every;
      }
}
