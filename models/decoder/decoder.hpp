// A pre-norm transformer decoder: a token embedding (and learned positions,
// or rotary ones inside attention), blocks of causal self-attention and an
// MLP (or, in a Mixture-of-Experts model, a MoE layer for some blocks' MLP),
// a final norm, and a language-model head, tied to the token embedding or
// its own. The block's form is the configuration's: GPT-2's (LayerNorm,
// biases, multi-head attention, GELU, learned positions, tied head) or
// Llama's (RMSNorm, no biases, grouped-query attention with RoPE, SwiGLU,
// untied head). One forward and one backward over a micro-batch, llm.c
// style: a block is a plain sequence of layers, and every activation the
// backward pass needs is a named buffer, allocated once from the tracker.
// The families that build it are rows of their own (models/gpt/,
// models/llama/); this file names none of them.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/foundation/memory.hpp"
#include "kernels/foundation/timeline.hpp"
#include "models/buffers.hpp"
#include "models/model.hpp"
#include "models/moe.hpp"
#include "models/param_registry.hpp"
#include "models/seams.hpp"
#include "models/state.hpp"
#include "plan/checks.hpp"
#include "plan/keys.hpp"
#include "plan/plan.hpp"

namespace strata::models {

// Mixture-of-Experts blocks: with experts > 0, block l's MLP is a MoE layer
// (models/moe.hpp) of `experts` copies of it when l % every == every - 1
// (every = 1: all blocks; 2: every other block, as GShard).
struct MoeBlocks {
  int experts = 0;  // 0: a dense model
  int every = 1;
  int top_k = 2;
  double capacity_factor = 1.25;
  bool drop_tokens = true;
  bool renormalize = true;
  float aux_coef = 0.01f;
};

// Activation recomputation, as the plan chooses it (plan/plan.hpp).
using plan::Recompute;

// The norm of a block (before attention, before the MLP) and of the head.
enum class Norm { layer, rms };

struct DecoderConfig {
  int layers = 2;
  int d_model = 64;
  int heads = 4;
  int ffn_mult = 4;
  int vocab = 256;
  int seq_len = 64;
  MoeBlocks moe = {};
  Recompute recompute = Recompute::none;
  // The format activations, their gradients and the parameters the model
  // reads are stored in (backend.precision): fp32, or 2 bytes an element.
  core::Precision precision = core::Precision::fp32;
  // The fused attention kernels (the CUDA backend's): the backward pass keeps
  // each row's log-sum-exp instead of the T x T probabilities. Must match the
  // device the kernels run on (checked when a model is built).
  bool fused_attention = false;
  // Unfused attention composed of batched products and the causal softmax
  // (kernels/unfused_attention.hpp): the CUDA backend's unfused form; the
  // CPU's and Kokkos' own attention operation materialises the scores
  // already. The state and scratch are the unfused ones either way.
  bool composed_attention = false;
  // The block's form; the defaults are GPT-2's.
  int kv_heads = 0;    // key-value heads (grouped-query attention); 0: heads
  int ffn_dim = 0;     // hidden units of the MLP; 0: ffn_mult x d_model
  Norm norm = Norm::layer;
  Activation act = Activation::gelu;
  bool bias = true;           // the linears and norms have biases
  float rope_theta = 0;       // > 0: rotary positions of this base; 0: a learned position table
  bool tie_embeddings = true;  // the head is the token embedding
  int kv() const { return kv_heads > 0 ? kv_heads : heads; }
  int ffn() const { return ffn_dim > 0 ? ffn_dim : ffn_mult * d_model; }
  bool rope() const { return rope_theta > 0; }
  bool is_moe(int layer) const { return moe.experts > 0 && layer % moe.every == moe.every - 1; }
  // The configuration of its MoE layers.
  MoeConfig moe_layer() const {
    return {d_model,         ffn(),        moe.experts, moe.top_k, moe.capacity_factor, moe.drop_tokens,
            moe.renormalize, moe.aux_coef, act,         bias,      precision};
  }
};

// The [model] keys of MoE blocks (moe_experts, moe_top_k, ...) and their
// checks: a family with MoE blocks owns them (models/decoder/keys.cpp).
std::vector<plan::KeySpec> moe_block_keys();
void check_moe_blocks(const plan::Plan& p, plan::PlanChecks& checks);

// The decoder sections of a plan's [model] section that every family reads
// the same way (sizes, MoE blocks, recomputation, and fused attention on the
// CUDA backend); a family sets the block's form.
DecoderConfig decoder_config(const plan::Plan& p);

// The parameters of a decoder stage, in flat-buffer order (embeddings,
// blocks, final norm and the untied head or, on a last stage without the
// embedding, the tied wte), as tensor-parallel rank `tp_rank` of `tp_size`
// holds them.
// With ep_size > 1 the MoE blocks' experts are split over the expert-parallel
// ranks, rank `ep_rank` holding experts [ep_rank E/ep, (ep_rank+1) E/ep).
ParamRegistry decoder_registry(const DecoderConfig& c, int tp_size = 1, int tp_rank = 0, Stage stage = {}, int ep_size = 1,
                           int ep_rank = 0);

// The whole model's parameter count in long double arithmetic, which no int
// field can overflow: what a deck's sizes are checked against before
// anything is built (decoder_registry(c).numel() where that fits; tested).
long double decoder_param_count(const DecoderConfig& c);

// Forward matmul FLOPs of one micro-batch of B sequences, per layer:
// [0] embedding (0), [1..L] blocks, [L+1] head. Attention counts the full
// T x T scores (as Megatron's formula does), not only the causal half.
std::vector<double> decoder_forward_flops(const DecoderConfig& c, int B);
// Model FLOPs of forward + backward over B sequences: 3x the forward.
double decoder_model_flops(const DecoderConfig& c, int B);
// FLOPs executed: the model's plus the forward work recomputation repeats
// (full: each block's norms-to-MLP-first-linear matmuls, a MoE block's
// attention part only; selective: the attention scores and their product
// with v; per-op: k, the attention projection and SwiGLU's up half).
double decoder_hardware_flops(const DecoderConfig& c, int B);

// The units of the state seam, contiguous and in flat-buffer order: wte and
// (learned positions) wpe if the stage has the embedding, each block (a MoE
// block as two: its attention, norms and router, then its experts), and the
// final norm with an untied head (or then the tied wte copy on a last stage
// without the embedding) if the stage has the head. For a whole dense GPT:
// wte 0, wpe 1, blocks 2..L+1, norm L+2.
std::vector<Unit> decoder_units(const ParamRegistry& reg, const DecoderConfig& c, Stage stage = {});

class Decoder final : public Model {
 public:
  // Allocates the activations and backward scratch of one micro-batch shape.
  // Parameters and gradients live in a ParamState (the state seam).
  // seams: where the layers meet other ranks (models/seams.hpp; one rank by
  // default): tensor parallelism splits every block, expert parallelism the
  // MoE layers' experts, context parallelism each sequence (the model runs
  // on this rank's seq_len / cp tokens of each). They must outlive the model.
  // split_backward: the backward pass may run as backward(input) then
  // backward_weight() (zero-bubble schedules): each linear keeps its output
  // gradient in between. scratch: the rank's shared scratch, which the
  // pipeline's stage models share (models/buffers.hpp); null: its own.
  Decoder(const DecoderConfig& config, int micro_batch, core::MemoryTracker& tracker, const Seams& seams = {},
          Stage stage = {}, bool split_backward = false, Scratch* scratch = nullptr);
  ~Decoder() override;

  const DecoderConfig& config() const { return c_; }
  int micro_batch() const { return B_; }
  const TensorSeam& tp() const { return *tp_; }
  // The MoE layer of global block `layer` on this stage, or null.
  const MoeLayer* moe_layer(int layer) const;

  const ParamRegistry& registry() const override { return reg_; }
  const std::vector<Unit>& units() const override { return units_; }
  const Stage& stage() const override { return stage_; }
  const std::vector<BufferSpec>& buffers() const override { return bufs_.specs(); }
  // The gradients at the stage's boundary take the places of its input and
  // output, which the backward pass has read (the input) or never reads
  // (the output of a stage without the head): no buffer per micro-batch
  // for them, and none shared that a later pass could overwrite while a
  // send is in flight.
  core::Ptr input() override { return encoded_; }
  core::CPtr output() const override { return output_of_stage(); }
  core::Ptr output_grad() override { return output_of_stage(); }
  core::CPtr input_grad() const override { return encoded_; }
  std::int64_t boundary_elements() const override { return Nl_ * c_.d_model; }
  float forward(ParamState& state, const std::int32_t* tokens, const std::int32_t* targets,
                prof::Timeline* tl = nullptr) override;
  void backward(ParamState& state, const std::int32_t* tokens, const std::int32_t* targets, float loss_scale,
                prof::Timeline* tl = nullptr, bool input_only = false) override;
  void backward_weight(ParamState& state, prof::Timeline* tl = nullptr) override;
  bool tied_head() const override { return c_.tie_embeddings; }
  std::vector<std::pair<int, const MoeLayer*>> routers() const override;

 private:
  // A linear layer y = x W^T + b of this rank's `in` inputs and `out`
  // outputs (models/linear.hpp). Built for a split backward, it keeps its
  // output gradient [N, out] from the input half to the weight half.
  struct Linear {
    int in = 0, out = 0;
    core::Ptr kept = nullptr;
    void forward(core::Ptr y, core::CPtr x, core::CPtr w, core::CPtr b, int N) const;
    // Where its output gradient goes: the kept buffer in an input-only pass
    // (nothing to copy later), else `scratch`.
    core::Ptr dy(core::Ptr scratch, bool input_only) const { return input_only ? kept : scratch; }
    // dx = dy W; then dW += dy^T x and db += colsum(dy) (fp32 gradients), or
    // (input-only) dy kept for weight().
    void backward(core::Ptr dx, core::CPtr dy, core::CPtr x, core::CPtr w, float* dw, float* db, int N,
                  bool input_only) const;
    void weight(float* dw, float* db, core::CPtr x, int N) const;
  };

  // The gradients of a block's parameters that every tensor-parallel rank
  // holds whole (norms, row-parallel biases), from this rank's rows: C
  // floats each in the scratch `rep_grads`, summed over the ranks where the
  // rows are split, then added to their gradients (finish_replicated). A
  // block without biases leaves their slots zero.
  enum Replicated { kLn1Weight, kLn1Bias, kProjBias, kLn2Weight, kLn2Bias, kFfnBias, kReplicated };

  // A block's activations that its backward pass reads: the norms' outputs
  // and statistics (this rank's rows: a shard under sequence parallelism,
  // gathered again where all rows are read; the statistics fp32, RMSNorm
  // keeping no mean), q k v (all N rows; q and k turned by RoPE),
  // attention's output and state (its probabilities, or the rows'
  // log-sum-exp, fp32), and the residual stream after attention. What
  // recomputation rebuilds is one set in the rank's scratch (the
  // recomputation policy, in the constructor).
  struct Acts {
    core::Ptr ln1, qkv, atty, att, res2, ln2;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
  };

  // A block's feed-forward half: it reads ln2 (all rows) and adds its
  // output to the residual stream res2, into the block's output.
  class Ffn;
  struct MlpBuffers;
  class Mlp;     // the dense MLP: fc, GELU or SwiGLU, proj
  class Experts;  // the MoE layer

  struct Block {
    int layer = 0;  // global block index (timeline and parameter names)
    int unit = 0;   // its unit: norms, attention, and the dense MLP or the router
    // Its parameters' offsets within the unit (-1: a bias it has not).
    std::int64_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b;
    Acts a;
    core::Ptr out = nullptr;  // the residual stream after the block [Nl, C]
    core::Ptr qv = nullptr;   // per-op recomputation: the block's q and v [N, Wqv]
    Linear qkv, proj;
    std::unique_ptr<Ffn> ffn;
  };

  // One block forward up to the feed-forward: norm, attention, residual,
  // norm (again in a recomputing backward; per_op: q k v rebuilt from the
  // kept q and v, attention's output kept). Returns all rows of the second
  // norm's output, for the feed-forward.
  core::CPtr attention_half(const Block& b, core::CPtr p, core::CPtr x, bool per_op = false);
  // Attention of this rank's heads (C of its channels) from a.qkv into
  // a.atty and its state a.att: the context seam's, or the composed
  // unfused kernels.
  void attend(const Acts& a, int C);
  // Per-op recomputation: q and v to or from their kept copy; q k v rebuilt.
  void keep_q_v(const Block& b, bool keep);
  void rebuild_qkv(const Block& b, core::CPtr p, core::CPtr ln1);
  // A block's forward from its input x; its backward, `next` the unit whose
  // backward follows (-1: none).
  void block_forward(ParamState& st, Block& b, core::CPtr x, double* aux);
  void block_backward(ParamState& st, Block& b, core::CPtr x, int next, float loss_scale, bool input_only);
  // A norm over this rank's rows into `out` (this rank's rows), returning
  // all rows of it (all_rows); all_rows gathers a norm's output kept as
  // this rank's rows into ln_all_ under sequence parallelism (else it is
  // all rows already); the residual add of the row-parallel sums in
  // dbuf_ (summed or reduce-scattered over tp) and a bias (if any); a norm's
  // backward into dres_ from the partial input gradients in dbuf_ (f
  // backward) or, `partial` false, from a whole one, its weight and bias
  // gradients into replicated slots k and k + 1.
  core::CPtr norm_rows(core::Ptr out, float* mean, float* rstd, core::CPtr x, core::CPtr w, core::CPtr b);
  core::CPtr all_rows(core::CPtr mine);
  void residual_rows(core::Ptr out, core::CPtr x, core::CPtr bias);
  // RoPE on q and k of a qkv buffer of all N rows (forward), or on their
  // gradient (backward: the turn back).
  void rotate(core::Ptr qkv, bool backward, bool k_only = false);
  void norm_back(core::CPtr x, core::CPtr w, const float* mean, const float* rstd, int k, bool partial = true);
  // The last block's output, or the stage's input on a stage without blocks.
  core::Ptr output_of_stage() const { return blocks_.empty() ? encoded_ : blocks_.back().out; }
  // The offset of parameter `name` in unit `unit`'s values, or -1 if the
  // model has no such parameter (a bias of a bias-free block).
  std::int64_t offset_in(int unit, const std::string& name) const;
  // The residual gradient of all N rows (gathered where they are split).
  core::CPtr dres_all();
  void finish_replicated(float* const* grads, int n);
  // The position rows of this rank's rows [r0_, r0_ + Nl_) of the residual
  // stream: added to `rows` (forward), or their gradient in `drows` (all N
  // rows) added to dwpe (backward); under context parallelism the rows'
  // positions come in runs (context_seam.hpp).
  void add_positions(core::Ptr rows, core::CPtr wpe);
  void position_grads(float* dwpe, core::CPtr drows);

  DecoderConfig c_;
  int B_;
  TensorSeam* tp_;
  ContextSeam* cp_;
  ExpertSeam* ep_;
  int T_;  // this rank's tokens of each sequence: seq_len / cp
  Stage stage_;
  std::int64_t Nl_ = 0, r0_ = 0;  // this rank's rows of the residual stream, from row r0_
  bool split_ = false;
  ParamRegistry reg_;
  std::vector<Unit> units_;
  core::MemoryTracker* tracker_;
  Buffers bufs_;
  std::vector<Block> blocks_;
  // Units: wte and (learned positions) wpe on a stage with the embedding,
  // the blocks, the final norm with an untied head and (a tied head on a
  // last stage without the embedding) the tied wte copy.
  static constexpr int kWteUnit = 0;
  int wpe_unit_ = -1;      // -1: rotary positions
  int head_unit_ = -1;     // unit of the final norm
  int head_w_unit_ = 0;    // the unit the head's weight is in
  std::int64_t lnfw_off_ = 0, lnfb_off_ = -1, head_off_ = 0;  // offsets in their units
  Linear head_;  // this rank's vocabulary columns; its kept output gradient is `logits`
  // The stage's input (the embedding's output, or the previous stage's
  // activations) and the head's activations (the row figures fp32).
  core::Ptr encoded_, lnf_ = nullptr, logits_ = nullptr;
  float *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr, *losses_ = nullptr, *ce_max_ = nullptr, *ce_sum_ = nullptr,
        *ce_target_ = nullptr;
  // The losses' host copy (untracked: N floats of host memory, not device).
  std::vector<float> host_losses_;
  // Backward scratch (workspace): the running residual gradient [Nl, C],
  // a linear's input gradient or partial sums [N, C], attention's q k v
  // gradient and scratch, the replicated gradients (fp32); where the rows
  // are split, a reduction's rows, the gathered residual gradient and a
  // norm's gathered output.
  core::Ptr dres_, dbuf_, dqkv_;
  std::byte* attn_scratch_ = nullptr;
  float* rep_grads_ = nullptr;
  core::Ptr sp_rows_ = nullptr, dres_full_ = nullptr, ln_all_ = nullptr;
  // Per-op recomputation's scratch for k and SwiGLU's up half [N, max].
  core::Ptr rebuilt_ = nullptr;
};

}  // namespace strata::models
