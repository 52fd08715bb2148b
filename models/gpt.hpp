// A GPT decoder (GPT-2 layout): token and position embeddings, pre-LayerNorm
// blocks of causal self-attention and an MLP, a final LayerNorm, and a
// language-model head tied to the token embedding. One forward and one
// backward over a micro-batch, llm.c style: every activation the backward
// pass needs is a named buffer below, allocated once from the tracker.
#pragma once

#include <array>
#include <memory>
#include <cstdint>
#include <string>
#include <vector>

#include "models/buffer_plan.hpp"
#include "models/moe.hpp"
#include "models/param_registry.hpp"
#include "models/state.hpp"
#include "models/context_seam.hpp"
#include "models/tensor_seam.hpp"
#include "kernels/foundation/communicator.hpp"
#include "kernels/foundation/memory.hpp"
#include "kernels/foundation/timeline.hpp"

namespace strata::models {

// Mixture-of-Experts blocks: with experts > 0, block l's MLP is a MoE layer
// (models/moe.hpp) of `experts` copies of it when l % every == every - 1
// (every = 1: all blocks; 2: every other block, as GShard).
struct GptMoe {
  int experts = 0;  // 0: a dense model
  int every = 1;
  int top_k = 2;
  double capacity_factor = 1.25;
  bool drop_tokens = true;
  bool renormalize = true;
  float aux_coef = 0.01f;
};

// Activation recomputation (gradient checkpointing): none; selective, the
// attention probabilities rebuilt from q and k in the backward pass
// (Korthikanti et al., 2022); full, each block's forward rebuilt from its
// stored input in its backward pass.
enum class Recompute { none, selective, full };

struct GptConfig {
  int layers = 2;
  int d_model = 64;
  int heads = 4;
  int ffn_mult = 4;
  int vocab = 256;
  int seq_len = 64;
  GptMoe moe;
  Recompute recompute = Recompute::none;
  // The fused attention kernels (the CUDA backend's): the backward pass keeps
  // each row's log-sum-exp instead of the T x T probabilities. Must match the
  // device the kernels run on (checked when a model is built).
  bool fused_attention = false;
  int ffn() const { return ffn_mult * d_model; }
  bool is_moe(int layer) const { return moe.experts > 0 && layer % moe.every == moe.every - 1; }
  // The configuration of its MoE layers.
  MoeConfig moe_layer() const {
    return {d_model, ffn(), moe.experts, moe.top_k, moe.capacity_factor, moe.drop_tokens, moe.renormalize,
            moe.aux_coef};
  }
};

// A pipeline stage: blocks [first, last), and whether it holds the
// embedding (the first stage) and the final norm, head and loss (the last).
// The default is the whole model. A last stage without the embedding holds
// its own copy of the tied `wte` (same name, so the same keyed values); the
// pipeline keeps the two copies' gradients summed.
struct GptStage {
  int first = 0;
  int last = -1;  // -1: every block
  bool embedding = true;
  bool head = true;
};
// Blocks per pipeline stage: `first` and `last` (>= 0) fix the first and
// the last stage's count (-1: balanced with the others, as Megatron's
// first/last pipeline-stage layer options), the rest spread evenly over the
// other stages, each of which must get at least one. A first stage of 0
// blocks holds the embedding alone; a last one, the head and loss alone.
std::vector<int> stage_block_counts(int layers, int stages, int first = -1, int last = -1);
// Stage `index` of `count` stages so split.
GptStage gpt_stage(const GptConfig& c, int index, int count, int first = -1, int last = -1);

// The parameters of a GPT stage, in flat-buffer order (embeddings, blocks,
// final norm and, on a last stage without the embedding, the tied wte), as
// tensor-parallel rank `tp_rank` of `tp_size` holds them.
// With ep_size > 1 the MoE blocks' experts are split over the expert-parallel
// ranks, rank `ep_rank` holding experts [ep_rank E/ep, (ep_rank+1) E/ep).
ParamRegistry gpt_registry(const GptConfig& c, int tp_size = 1, int tp_rank = 0, GptStage stage = {},
                           int ep_size = 1, int ep_rank = 0);

// The whole model's parameter count in long double arithmetic, which no int
// field can overflow: what a deck's sizes are checked against before
// anything is built (gpt_registry(c).numel() where that fits; tested).
long double gpt_param_count(const GptConfig& c);

// split_backward: the buffers that keep each linear's output gradient from
// the input-gradient half of the backward pass to the weight-gradient half.
// cp: the context seam (this rank's seq_len / cp.size() tokens of each
// sequence, and attention's state and scratch).
std::vector<BufferPlan> gpt_activation_plan(const GptConfig& c, int micro_batch, int tp_size = 1,
                                            bool sequence_parallel = false, GptStage stage = {},
                                            bool split_backward = false, const ContextSeam& cp = whole_sequence());

// The buffers the MoE layers of a stage allocate (each its own, from
// moe_buffer_plan), beside the model's activation plan: the dry run's
// estimate adds them.
std::vector<BufferPlan> gpt_moe_plan(const GptConfig& c, int micro_batch, GptStage stage = {}, int cp_size = 1);

// Forward matmul FLOPs of one micro-batch of B sequences, per layer:
// [0] embedding (0), [1..L] blocks, [L+1] head. Attention counts the full
// T x T scores (as Megatron's formula does), not only the causal half.
std::vector<double> gpt_forward_flops(const GptConfig& c, int B);
// Model FLOPs of forward + backward over B sequences: 3x the forward.
double gpt_model_flops(const GptConfig& c, int B);
// FLOPs executed: the model's plus the forward work recomputation repeats
// (full: each block's norms-to-MLP-first-linear matmuls, a MoE block's
// attention part only; selective: the attention scores and their product
// with v).
double gpt_hardware_flops(const GptConfig& c, int B);

// The units of the state seam, contiguous and in flat-buffer order: wte and
// wpe if the stage has the embedding, each block (a MoE block as two: its
// attention, norms and router, then its experts), and the final norm (then
// the tied wte copy on a last stage without the embedding) if the stage has
// the head. For a whole dense model: wte 0, wpe 1, blocks 2..L+1, norm L+2.
std::vector<Unit> gpt_units(const ParamRegistry& reg, const GptConfig& c, GptStage stage = {});

class Gpt {
 public:
  // Allocates the activations and backward scratch of one micro-batch shape.
  // Parameters and gradients live in a ParamState (the state seam).
  // split_backward: the backward pass may run as backward(input) then
  // backward_weight() (zero-bubble schedules), which keeps each linear's
  // output gradient in between.
  // tp: where the layers meet the ranks they are split over (the layer
  // seam: models/tensor_seam.hpp; one rank by default, or
  // strategies/tp.cpp's tensor and sequence parallelism). It must outlive
  // the model. ep: where the MoE blocks' tokens meet the ranks holding the
  // other experts (models/expert_seam.hpp; one rank by default, or
  // strategies/ep.cpp's all-to-all), which must outlive the model too. cp:
  // where attention meets the ranks holding the rest of each sequence
  // (models/context_seam.hpp; whole sequences by default, or
  // strategies/cp.cpp's ring attention): the model runs on this rank's
  // seq_len / cp.size() tokens of each sequence; it must outlive the model.
  Gpt(const GptConfig& config, int micro_batch, core::MemoryTracker& tracker, TensorSeam& tp = one_rank(),
      GptStage stage = {}, bool split_backward = false, ExpertSeam& ep = one_expert_rank(),
      ContextSeam& cp = whole_sequence());

  const GptConfig& config() const { return c_; }
  int micro_batch() const { return B_; }
  const ParamRegistry& registry() const { return reg_; }
  const std::vector<Unit>& units() const { return units_; }
  const TensorSeam& tp() const { return *tp_; }
  const GptStage& stage() const { return stage_; }
  // A stage without the embedding reads its input activations [rows, C] here
  // (fill before forward); a stage without the head takes the gradient of
  // its output here (fill before backward), and after backward this holds
  // the gradient of its input. `output()` is the stage's output after forward.
  float* input() { return encoded_; }
  const float* output() const;
  float* output_grad() { return dres_; }
  const float* input_grad() const { return dres_; }

  // tokens and targets are [B, T] (T this rank's tokens of each sequence).
  // Returns the mean cross-entropy over B*T (0 on a stage without the head).
  // Every forward is followed by a backward (the head's parameters stay
  // acquired from one to the other).
  // A MoE model adds its blocks' auxiliary losses (this stage's) to the result.
  float forward(ParamState& state, const std::int32_t* tokens, const std::int32_t* targets,
                prof::Timeline* tl = nullptr);
  // The MoE layer of global block `layer` on this stage, or null.
  const MoeLayer* moe_layer(int layer) const {
    const int lb = layer - stage_.first;
    return lb >= 0 && lb < int(moe_.size()) ? moe_[std::size_t(lb)].get() : nullptr;
  }
  // Backward of (mean loss * loss_scale) for the last forward; parameter
  // gradients accumulate into the state's gradients (loss_scale = 1 /
  // micro-batches gives the mean over a global batch).
  // With `input_only` (a model built with split_backward) it computes the
  // gradients of the stage's input and of the norms, the embedding and the
  // sequence-parallel biases, and keeps each linear's output gradient;
  // backward_weight() then adds the linears' weight and bias gradients and
  // says the units are done.
  void backward(ParamState& state, const std::int32_t* tokens, const std::int32_t* targets, float loss_scale,
                prof::Timeline* tl = nullptr, bool input_only = false);
  void backward_weight(ParamState& state, prof::Timeline* tl = nullptr);

 private:
  // In a MoE block, fc_* and fcproj_* are this rank's experts' (expert after
  // expert, in the block's expert unit) and router the router's; in a dense
  // block router is null.
  struct LayerParams {
    float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b,
        *router;
  };
  static constexpr int kParamsPerLayer = 13;
  // One block's activations (the slot recomputation shares, or its own).
  struct BlockActs {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu;
  };
  BlockActs block_acts(int lb) const;
  // A norm over this rank's rows, gathered to all rows under sequence
  // parallelism; the residual add of the row-parallel sums in dbuf_ (summed
  // or reduce-scattered over tp) and a bias.
  void norm_rows(float* out_all, float* mean, float* rstd, const float* x, const float* w, const float* b);
  void residual_rows(float* out, const float* x, const float* bias);
  // A block's forward up to its MLP (norms, attention, the residual) and
  // the dense MLP's first linear and GELU: run by the forward pass, and
  // again by a fully recomputing backward.
  void block_front(const BlockActs& a, const LayerParams& p, const float* x);
  void mlp_front(const BlockActs& a, const LayerParams& p);
  // Views into block l's unit (its first element at `unit_base`) and, for a
  // MoE block, its expert unit (null: the expert views are not used).
  LayerParams layer_view(float* unit_base, float* expert_base, int l) const;
  float* act(const char* name);
  // The replicated parameters' gradients of this rank's rows in rep_grads_
  // (slot k: grads[k]), summed over the ranks where the rows are split,
  // added to their gradients.
  void finish_replicated(float* const* grads, int n);
  // The position rows of this rank's rows [r0_, r0_ + Nl_) of the residual
  // stream: added to `rows` (forward), or their gradient in `drows` (all N
  // rows) added to dwpe (backward); under context parallelism the rows'
  // positions come in runs (context_seam.hpp).
  void add_positions(float* rows, const float* wpe);
  void position_grads(float* dwpe, const float* drows);

  GptConfig c_;
  int B_;
  TensorSeam* tp_;
  ContextSeam* cp_;
  int T_;  // this rank's tokens of each sequence: seq_len / cp

  GptStage stage_;
  std::int64_t Nl_ = 0, r0_ = 0;  // this rank's rows of the residual stream, from row r0_
  int blocks_ = 0;               // blocks on this stage
  // Units: wte and wpe (a stage with the embedding), the blocks, the final
  // norm and (a last stage without the embedding) the tied wte copy.
  static constexpr int kWteUnit = 0, kWpeUnit = 1;
  int head_unit_ = -1;           // unit of the final norm
  int head_wte_unit_ = 0;        // the unit the head reads wte from
  int block_unit(int lb) const { return block_unit_[std::size_t(lb)]; }
  std::vector<int> block_unit_;   // per block, and the unit after the last block
  std::vector<int> expert_unit_;  // per block: its experts' unit, -1 for a dense block
  std::vector<int> dense_index_;  // per block: its index among the stage's dense blocks, -1 for a MoE block
  ParamRegistry reg_;
  std::vector<Unit> units_;
  // Unit-relative offsets of each block's 12 parameters, in LayerParams order,
  // and of lnf's weight and bias in the final norm's unit.
  std::vector<std::array<std::int64_t, kParamsPerLayer>> layer_offsets_;
  std::int64_t lnfw_off_ = 0, lnfb_off_ = 0;
  std::vector<BufferPlan> plan_;
  std::vector<core::Buffer<float>> acts_;
  // Activation pointers, resolved once from the plan.
  float *encoded_, *ln1_, *ln1_mean_, *ln1_rstd_, *qkv_, *atty_, *att_, *res2_, *ln2_, *ln2_mean_, *ln2_rstd_,
      *fch_, *fch_gelu_, *res3_, *lnf_, *lnf_mean_, *lnf_rstd_, *logits_, *losses_, *ce_max_, *ce_sum_, *ce_target_;
  // The losses' host copy (untracked: N floats of host memory, not device).
  std::vector<float> host_losses_;
  // Backward scratch (workspace).
  float *dres_, *dbuf_, *dqkv_, *dprobs_, *dfch_, *dgelu_;
  // The gradients of a block's replicated parameters from this rank's rows
  // (ln1 w, b; proj b; ln2 w, b; mlp proj b). Where the rows are split
  // (sequence parallelism): a reduction's rows and the gathered residual
  // gradient.
  float* rep_grads_ = nullptr;
  float *sp_rows_ = nullptr, *dres_full_ = nullptr;
  // Split backward only: per block, the output gradients of the MLP
  // projection, the MLP's first linear, the attention projection and QKV.
  bool split_ = false;
  float *dy_fcproj_ = nullptr, *dy_fc_ = nullptr, *dy_proj_ = nullptr, *dy_qkv_ = nullptr;
  // The MoE layer of each MoE block on this stage (null for a dense block),
  // holding its routing and expert activations.
  std::vector<std::unique_ptr<MoeLayer>> moe_;
};

}  // namespace strata::models
