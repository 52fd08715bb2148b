// docs/costs.md's closed forms, held against the dry run: the activation
// bytes a block keeps per micro-batch for every block form (GPT-2's, Llama's,
// MoE) and recomputation mode, with tensor, sequence and context
// parallelism, in fp32 and 16 bits, unfused and fused attention, to the
// byte; the state bytes per parameter for every ZeRO stage, gradient
// precision and reduction timing, to the byte; and Llama 3 405B at Meta's
// layout, every stage's peak per category against the closed form, which
// this test prints (activations, parameters, gradients and optimizer state
// to the byte; workspace and communication buffers, whose closed forms
// name their dominant terms only, within 10 %).
//
// The formulas are written here from the docs, not taken from the model's
// code: only sizes (the configuration, the parameter registry, the
// schedule's count of micro-batches in flight) come from it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "models/decoder/decoder.hpp"
#include "models/gpt/family.hpp"
#include "models/llama/family.hpp"
#include "src/deck/deck.hpp"
#include "src/train/estimate.hpp"
#include "strategies/pp/liveness.hpp"
#include "strategies/pp/schedule.hpp"

using namespace strata;
using core::MemCategory;
using core::Pool;
using std::int64_t;

namespace {

// What the closed forms read: a block's configuration and the layout's
// split of it.
struct Shape {
  models::DecoderConfig c;
  int64_t b = 1;      // micro-batch
  int64_t s = 1;      // this rank's tokens of a sequence (seq_len / cp)
  int64_t t = 1;      // tp
  bool sp = false;    // sequence parallelism (with t > 1)
  int64_t cp = 1;
  int64_t e = 4;      // bytes of an activation (2 under bf16 / fp16)
  bool fused = false;  // fused attention (the CUDA backend's): the state is the rows' log-sum-exp
  int64_t N() const { return b * s; }
  int64_t Nl() const { return sp ? N() / t : N(); }  // this rank's rows of the residual stream
  int64_t h() const { return c.d_model; }
  int64_t hkv() const { return int64_t(c.d_model) / c.heads * c.kv(); }  // the k (or v) width
  int64_t F() const { return c.ffn(); }
  int64_t Fp() const { return c.act == models::Activation::swiglu ? 2 * F() : F(); }
  bool swiglu() const { return c.act == models::Activation::swiglu; }
};

Shape shape_of(const plan::Plan& p) {
  Shape x;
  x.c = p.model.kind->name == "llama" ? models::llama_config(p) : models::gpt_config(p);
  x.b = p.data.micro_batch;
  x.cp = p.parallel.cp;
  x.s = p.model.seq_len / x.cp;
  x.t = p.parallel.tp;
  x.sp = p.parallel.sequence_parallel && x.t > 1;
  x.e = int64_t(core::element_bytes(p.backend.precision));
  x.fused = p.fused_attention();
  return x;
}

// ---- activations (docs/costs.md, "Activations per block") ----------------

// A norm's statistics: fp32 rstd, and LayerNorm's mean, per row.
int64_t stats(const Shape& x) { return (x.c.norm == models::Norm::layer ? 2 : 1) * x.Nl() * 4; }
// Attention's state: the probabilities (b a/t s^2, unfused: 2as/h bytes per
// s b h element at 16 bits, Korthikanti et al.'s 5as/h less attention
// dropout's mask and output, which Strata does not apply), or the rows'
// log-sum-exp in fp32 (fused, and context parallelism's ring).
int64_t attention_state(const Shape& x) {
  const int64_t heads = x.c.heads / x.t;
  return x.fused || x.cp > 1 ? x.b * heads * x.s * 4 : x.b * heads * x.s * x.s * x.e;
}
int64_t qkv(const Shape& x) { return x.N() * (x.h() + 2 * x.hkv()) / x.t * x.e; }
int64_t rows(const Shape& x) { return x.Nl() * x.h() * x.e; }  // ln1, ln2, res2, the block output
int64_t atty(const Shape& x) { return x.N() * x.h() / x.t * x.e; }
// A MoE layer's own: router logits, the expert rows in and back, their
// hidden activations before and after the activation, E x capacity rows.
int64_t moe_layer(const Shape& x) {
  const auto& m = x.c.moe;
  const int64_t N = x.N(), E = m.experts;
  const int64_t cap =
      m.drop_tokens ? std::min<int64_t>(N, int64_t(std::ceil(m.capacity_factor * double(N) * m.top_k / E))) : N;
  const int64_t slots = E * cap;
  return (N * E + slots * (2 * x.h() + x.Fp() + x.F())) * x.e;
}
int64_t mlp(const Shape& x) { return x.N() * (x.Fp() + x.F()) / x.t * x.e; }

// Kept by one block for one micro-batch.
int64_t block_kept(const Shape& x, bool moe) {
  const int64_t ffn = moe ? moe_layer(x) : 0;  // a MoE layer keeps its own under every mode
  switch (x.c.recompute) {
    case plan::Recompute::none:
      return 2 * rows(x) + 2 * stats(x) + qkv(x) + atty(x) + attention_state(x) + 2 * rows(x) + (moe ? ffn : mlp(x));
    case plan::Recompute::selective:
      return 2 * rows(x) + 2 * stats(x) + qkv(x) + atty(x) + 2 * rows(x) + (moe ? ffn : mlp(x));
    case plan::Recompute::full:
      return rows(x) + ffn;  // the block's output: the next block's input
    case plan::Recompute::op: {
      // q and v, attention's output and state, the MLP's first output (its
      // gate half and the projection's [N, h] output under SwiGLU), the
      // block's output.
      const int64_t q_v = x.N() * (x.h() + x.hkv()) / x.t * x.e;
      const int64_t first = x.N() * x.F() / x.t * x.e, proj = x.swiglu() ? x.N() * x.h() * x.e : 0;
      return q_v + atty(x) + attention_state(x) + rows(x) + (moe ? ffn : first + proj);
    }
  }
  return 0;
}

// Rebuilt: one set a rank, shared by its blocks and stage models.
int64_t rebuilt_set(const Shape& x, bool dense_blocks) {
  const int64_t hidden = dense_blocks ? mlp(x) : 0;
  switch (x.c.recompute) {
    case plan::Recompute::none: return 0;
    case plan::Recompute::selective: return attention_state(x);
    case plan::Recompute::full:
      return 2 * rows(x) + 2 * stats(x) + qkv(x) + atty(x) + attention_state(x) + rows(x) + hidden;
    case plan::Recompute::op: {
      const int64_t fc = dense_blocks && x.swiglu() ? x.N() * x.Fp() / x.t * x.e : 0;
      const int64_t act = dense_blocks ? x.N() * x.F() / x.t * x.e : 0;
      return 2 * rows(x) + 2 * stats(x) + qkv(x) + rows(x) + fc + act;
    }
  }
  return 0;
}

// A stage model's own besides its blocks: its input, and on the last stage
// the final norm, the logits (the rank's V / t columns) and the loss's four
// fp32 rows.
int64_t stage_extra(const Shape& x, bool head) {
  return rows(x) + (head ? rows(x) + stats(x) + x.N() * x.c.vocab / x.t * x.e + 4 * x.N() * 4 : 0);
}

plan::Plan tiny_deck(const std::vector<std::string>& sets) {
  const std::string text =
      "[run]\nsteps = 2\nwarmup_steps = 0\nseed = 3\n"
      "[model]\nlayers = 3\nd_model = 32\nheads = 4\nvocab = 64\nseq_len = 16\n"
      "[data]\nglobal_batch = 2\nmicro_batch = 2\n"
      "[backend]\nthreads = 1\n";
  return deck::parse_deck("costs.toml", text, sets).config;
}

// The activations one rank of a one-stage layout holds: L blocks of one
// micro-batch, the rebuilt set, the stage's input and head, and the step's
// token ids and targets (int32).
int64_t closed_form_activations(const plan::Plan& p) {
  const Shape x = shape_of(p);
  int64_t total = 0, dense = 0;
  for (int l = 0; l < p.model.layers; ++l) {
    total += block_kept(x, x.c.is_moe(l));
    dense += x.c.is_moe(l) ? 0 : 1;
  }
  return total + rebuilt_set(x, dense > 0) + stage_extra(x, true) + 2 * x.N() * 4;
}

}  // namespace

TEST(ClosedForm, ActivationsPerBlockAreTheDocsToTheByte) {
  const std::vector<std::vector<std::string>> forms = {
      {},                                                      // GPT-2, fp32, unfused
      {"backend.precision=\"bf16\""},                          // 16-bit
      {"backend.precision=\"bf16\"", "backend.device=\"cuda\""},  // fused attention (the meta device counts it)
      {"backend.precision=\"bf16\"", "backend.device=\"cuda\"", "model.attention=\"unfused\""},  // composed, on cuda
      {"model.kind=\"llama\"", "model.kv_heads=2", "model.ffn_dim=48", "backend.precision=\"bf16\""},
      {"model.kind=\"llama\"", "model.kv_heads=2", "model.ffn_dim=48", "backend.precision=\"bf16\"",
       "parallel.tp=2", "parallel.sequence_parallel=true"},
      {"parallel.tp=2"},
      {"parallel.tp=2", "parallel.sequence_parallel=true", "backend.precision=\"bf16\"", "backend.device=\"cuda\""},
      {"parallel.tp=2", "parallel.sequence_parallel=true", "backend.precision=\"fp16\"", "backend.device=\"cuda\"",
       "model.attention=\"unfused\""},
      {"parallel.cp=2", "backend.precision=\"bf16\""},
      {"model.kind=\"moe\"", "model.moe_experts=4", "model.moe_every=2", "backend.precision=\"bf16\""},
      {"model.kind=\"llama\"", "model.moe_experts=4", "model.moe_every=2", "model.kv_heads=2", "parallel.tp=2",
       "parallel.sequence_parallel=true"},
  };
  for (const auto& form : forms)
    for (const char* mode : {"none", "selective", "full", "op"}) {
      auto sets = form;
      sets.push_back(fmt::format("model.recompute=\"{}\"", mode));
      const plan::Plan p = tiny_deck(sets);
      SCOPED_TRACE(fmt::format("{} recompute {}", fmt::join(form, " "), mode));
      const train::RankMemory m = train::estimate_rank(p, 0);
      EXPECT_EQ(int64_t(m[Pool::device].held[std::size_t(MemCategory::activations)]), closed_form_activations(p));
    }
}

// Llama 3 8B's block at sequence 8192, one sequence, bf16, fused attention,
// no recomputation: 34 bytes per (sequence x hidden) element and the fp32
// row figures (rstd twice, 4 x 32 heads of log-sum-exp: 136 bytes a token).
TEST(ClosedForm, Llama3_8BLayerIs34BytesPerElement) {
  const plan::Plan p = tiny_deck({"model.kind=\"llama\"", "model.layers=1", "model.d_model=4096", "model.heads=32",
                             "model.kv_heads=8", "model.ffn_dim=14336", "model.vocab=128256", "model.seq_len=8192",
                             "data.micro_batch=1", "data.global_batch=1", "backend.precision=\"bf16\"",
                             "backend.device=\"cuda\""});
  const Shape x = shape_of(p);
  const int64_t sbh = 8192ll * 4096, layer = block_kept(x, false);
  EXPECT_EQ(layer, 34 * sbh + 8192ll * (2 * 4 + 32 * 4));
  auto two = tiny_deck({"model.kind=\"llama\"", "model.layers=2", "model.d_model=4096", "model.heads=32",
                   "model.kv_heads=8", "model.ffn_dim=14336", "model.vocab=128256", "model.seq_len=8192",
                   "data.micro_batch=1", "data.global_batch=1", "backend.precision=\"bf16\"",
                   "backend.device=\"cuda\""});
  const auto act = [](const train::RankMemory& m) {
    return int64_t(m[Pool::device].held[std::size_t(MemCategory::activations)]);
  };
  const int64_t measured = act(train::estimate_rank(two, 0)) - act(train::estimate_rank(p, 0));
  EXPECT_EQ(measured, layer);
  std::printf("Llama 3 8B, one layer, s 8192, b 1, bf16, fused attention, no recomputation: %lld bytes = %.4f "
              "bytes per s b h element (%.4f GiB)\n",
              static_cast<long long>(measured), double(measured) / double(sbh), double(measured) / double(1ll << 30));
}

// State bytes per parameter, held at the end of a step, for a rank of dp 4
// (N = 4): Psi the rank's parameters, S = sum over units of ceil(unit / N)
// (the shard; N S = Psi_p, Psi padded per unit). e_p the parameters' bytes
// (4, or 2 under 16 bits), e_g the gradients' (e_p, or 4 with grad_reduce
// fp32), o the optimizer's per owned element (8: two fp32 moments; 12 with
// fp32 master weights under 16 bits).
//   zero 0: e_p Psi,   e_g Psi,   o Psi
//   zero 1: e_p N S,   e_g N S,   o S
//   zero 2: e_p N S,   e_g S,     o S   (grad_sync step: e_g (N S + S))
//   zero 3: e_p S,     e_g S,     o S   (grad_sync step: e_g (N S + S))
TEST(ClosedForm, StateBytesPerParameterAreTheDocsToTheByte) {
  const int64_t N = 4;
  for (const char* precision : {"fp32", "bf16"})
    for (const char* grads : {"compute", "fp32"})
      for (int zero = 0; zero <= 3; ++zero)
        for (const char* sync : {"auto", "step", "micro_batch"}) {
          if (std::string(sync) == "micro_batch" && zero < 2) continue;  // refused: no gradient shard
          const plan::Plan p =
              tiny_deck({"model.d_model=24", "parallel.dp=4", "data.global_batch=8", "data.micro_batch=1",
                    fmt::format("parallel.zero={}", zero), fmt::format("backend.precision=\"{}\"", precision),
                    fmt::format("parallel.grad_reduce=\"{}\"", grads), fmt::format("parallel.grad_sync=\"{}\"", sync)});
          SCOPED_TRACE(fmt::format("{} grad_reduce {} zero {} grad_sync {}", precision, grads, zero, sync));
          const models::DecoderConfig c = models::gpt_config(p);
          const models::ParamRegistry reg = models::decoder_registry(c);
          int64_t S = 0;
          for (const auto& u : models::decoder_units(reg, c)) S += (u.size() + N - 1) / N;
          const int64_t psi = reg.numel(), e_p = std::string(precision) == "fp32" ? 4 : 2;
          const int64_t e_g = std::string(grads) == "fp32" ? 4 : e_p, o = e_p == 4 ? 8 : 12;
          const bool step = std::string(sync) == "step" || (std::string(sync) == "auto" && zero < 2);
          int64_t params = 0, g = 0, opt = 0;
          switch (zero) {
            case 0: params = e_p * psi, g = e_g * psi, opt = o * psi; break;
            case 1: params = e_p * N * S, g = e_g * N * S, opt = o * S; break;
            case 2: params = e_p * N * S, g = e_g * (S + (step ? N * S : 0)), opt = o * S; break;
            case 3: params = e_p * S, g = e_g * (S + (step ? N * S : 0)), opt = o * S; break;
          }
          const train::RankMemory m = train::estimate_rank(p, 0);
          const auto& held = m[Pool::device].held;
          EXPECT_EQ(int64_t(held[std::size_t(MemCategory::params)]), params);
          EXPECT_EQ(int64_t(held[std::size_t(MemCategory::grads)]), g);
          EXPECT_EQ(int64_t(held[std::size_t(MemCategory::optimizer)]), opt);
        }
}

// Llama 3 405B at Meta's layout (inputs/llama/llama3-405b.toml: tp 8 with
// sequence parallelism, pp 16 under 1F1B with 7 blocks on the first and the
// last stage, dp 128 with ZeRO-2, bf16, 16 micro-batches of one 8192-token
// sequence): each stage's peak per category against the closed form. A
// stage holds its in-flight micro-batches' activations (1F1B: p - r on
// stage r, the schedule's liveness) of its blocks, input and head, the
// step's tokens; the state of its parameters (ZeRO-2: 2 N S + 2 S + 12 S
// bytes); as workspace the rank's shared scratch (dres, dbuf, dqkv,
// attention's, the MLP's two, sequence parallelism's four, the replicated
// norms' gradients) and one unit's fp32 gradient accumulator; as
// communication buffers two units' 16-bit unreduced gradients (the
// reduce-scatter in flight and the next, the bucket's bound).
TEST(ClosedForm, Llama3_405BStagesAreTheClosedForm) {
  const plan::Plan p = deck::load_deck(STRATA_SOURCE_DIR "/inputs/llama/llama3-405b.toml", {}).config;
  const Shape x = shape_of(p);
  const int P = p.parallel.pp, m = p.micro_batches(), N = p.parallel.dp;
  const auto counts = models::stage_block_counts(p.model.layers, P, p.parallel.first_stage_layers,
                                                 p.parallel.last_stage_layers);
  const strategies::pp::Schedule schedule =
      strategies::pp::make_schedule(*p.parallel.schedule, {P, m, p.parallel.virtual_stages});
  const train::Estimate est = train::estimate(p);
  ASSERT_EQ(int(est.classes.size()), P);
  const int64_t e = x.e, Nt = x.N(), C = x.h(), Ct = C / x.t;
  // The shared scratch (docs/costs.md, "Workspace").
  const int64_t scratch = rows(x) + Nt * C * e + qkv(x) + (x.b * x.c.heads / x.t * x.s + x.b * x.s * Ct) * 4 +
                          x.N() * (x.Fp() + x.F()) / x.t * e + 6 * C * 4 + rows(x) + 2 * Nt * C * e;
  const double GiB = double(1ll << 30);
  std::printf("stage  category     dry run (GiB)  closed form (GiB)  error\n");
  for (int r = 0; r < P; ++r) {
    const models::Stage stage = models::stage_of(p.model.layers, r, P, p.parallel.first_stage_layers,
                                                 p.parallel.last_stage_layers);
    const models::ParamRegistry reg = models::decoder_registry(x.c, int(x.t), 0, stage);
    int64_t S = 0, unit = 0;
    for (const auto& u : models::decoder_units(reg, x.c, stage)) {
      S += (u.size() + N - 1) / N;
      unit = std::max(unit, (u.size() + N - 1) / N * N);
    }
    const int slots = strategies::pp::liveness(schedule[std::size_t(r)]).slots[0];
    EXPECT_EQ(slots, std::min(m, P - r)) << "1F1B: p - r micro-batches in flight on stage " << r;
    const bool head = r == P - 1;
    const int64_t act = int64_t(slots) * (counts[std::size_t(r)] * block_kept(x, false) + stage_extra(x, head)) +
                        rebuilt_set(x, true) + 2 * x.N() * 4 * (m + 1);
    const int64_t want[] = {2 * N * S, 2 * S, 12 * S, act, scratch + 4 * unit, 2 * 2 * unit};
    const MemCategory cats[] = {MemCategory::params,     MemCategory::grads,     MemCategory::optimizer,
                                MemCategory::activations, MemCategory::workspace, MemCategory::comm};
    const char* names[] = {"params", "grads", "optimizer", "activations", "workspace", "comm"};
    const auto& peak = est.classes[std::size_t(r)].memory[Pool::device].peak;
    for (int k = 0; k < 6; ++k) {
      const int64_t got = int64_t(peak[std::size_t(cats[k])]);
      const double err = double(got - want[k]) / double(want[k]);
      std::printf("%5d  %-11s  %13.3f  %17.3f  %+6.2f%%\n", r, names[k], double(got) / GiB, double(want[k]) / GiB,
                  100 * err);
      if (k < 4)
        EXPECT_EQ(got, want[k]) << names[k] << " of stage " << r;
      else
        EXPECT_LE(std::fabs(err), 0.10) << names[k] << " of stage " << r;
    }
    std::printf("%5d  %-11s  %13.3f\n", r, "total", double(est.classes[std::size_t(r)].memory[Pool::device].total_peak) / GiB);
  }
}
