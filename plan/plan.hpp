// The plan: what a deck resolves to, once, in typed values (every choice an
// enum or a registry row, never a string), read by every module. Section
// and key names follow the deck exactly (docs/decks.md), since sweeps and
// tests address keys as "section.key". It is a floor of its own, below the
// models and the strategies, because their registry rows declare and check
// their own keys (plan/keys.hpp); the harness (src/deck) parses TOML into
// it. A choice that is a row of a higher floor's table (the schedule) is a
// pointer to it, declared here and defined by that floor.
#pragma once

#include <array>
#include <stdexcept>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/foundation/precision.hpp"
#include "kernels/kernels.hpp"

namespace strata::strategies::pp {
struct ScheduleInfo;
// The schedule row of that name (strategies/pp/schedule.cpp).
const ScheduleInfo& find_schedule(const std::string& name);
}  // namespace strata::strategies::pp

namespace strata::models {
struct Family;
// The model family of that name (models/model.cpp).
const Family& find_family(std::string_view name);
}  // namespace strata::models

namespace strata::plan {

// Activation recomputation (gradient checkpointing): none; selective, the
// attention probabilities rebuilt from q and k in the backward pass
// (Korthikanti et al., 2022, Megatron-LM's); full, each block's forward
// rebuilt from its stored input in its backward pass; op, torchtitan's
// per-op selective policy (every second matmul's output and attention's
// outputs kept, the rest rebuilt from the block's input).
enum class Recompute { none, selective, full, op };

// model.attention: which attention kernels. fused keeps the T x T scores
// on chip (FlashAttention: the CUDA backend's kernels; the state the rows'
// log-sum-exp); unfused materialises them, masks and softmaxes them in
// memory and keeps the probabilities (Megatron-LM before FlashAttention;
// the CPU's and Kokkos' attention, and on the CUDA backend a composition of
// batched products and the causal softmax); auto: fused on cuda, unfused
// elsewhere.
enum class Attention { auto_, fused, unfused };

enum class DataSource { synthetic, text };
enum class Offload { none, host, nvme };
enum class LrSchedule { constant, cosine };
// run.on_divergence: what a non-finite loss or gradient norm does.
enum class OnDivergence { stop, continue_ };
// backend.comm: auto is NCCL on a GPU and MPI on the CPU.
enum class CommChoice { auto_, mpi, nccl };
// parallel.grad_reduce: the precision gradients are accumulated over
// micro-batches, stored and reduced over ranks in under a 16-bit precision:
// the compute precision's, or fp32.
enum class GradReduce { compute, fp32 };
// parallel.grad_sync: when the gradients a step accumulates over its
// micro-batches are reduced over the data-parallel ranks: once, at the end
// of the step's last backward pass (step: each rank holds whole gradients
// between micro-batches, as DDP's no_sync, Megatron-LM's distributed
// optimizer and FSDP's no_sync), or after every micro-batch into the
// gradient shard (micro_batch: DeepSpeed's ZeRO-2, FSDP's default). auto:
// step under ZeRO 0 and 1, whose gradients are whole anyway, micro_batch
// under ZeRO 2 and 3, whose point is not to hold them
// (ParallelSection::reduce_every_micro_batch).
enum class GradSync { auto_, step, micro_batch };

// A value a deck names from a fixed list: an enum (its i-th name names
// value i), or a registry row. Choice<T> gives the names in order, the value
// of the i-th and the index of a value.
template <typename T>
struct Choice;

template <typename E, const auto& kNames>
struct EnumChoice {
  static std::vector<std::string_view> names() { return {kNames.begin(), kNames.end()}; }
  static E at(std::size_t i) { return E(i); }
  static std::size_t index(E e) { return std::size_t(e); }
};
inline constexpr std::array<std::string_view, 3> kAttentions{"auto", "fused", "unfused"};
inline constexpr std::array<std::string_view, 2> kDataSources{"synthetic", "text"};
inline constexpr std::array<std::string_view, 3> kOffloads{"none", "host", "nvme"};
inline constexpr std::array<std::string_view, 2> kLrSchedules{"constant", "cosine"};
inline constexpr std::array<std::string_view, 2> kOnDivergence{"stop", "continue"};
inline constexpr std::array<std::string_view, 3> kCommChoices{"auto", "mpi", "nccl"};
inline constexpr std::array<std::string_view, 2> kGradReduces{"compute", "fp32"};
inline constexpr std::array<std::string_view, 3> kGradSyncs{"auto", "step", "micro_batch"};
inline constexpr std::array<std::string_view, 4> kRecomputes{"none", "selective", "full", "op"};
inline constexpr std::array<std::string_view, 3> kPrecisions{"fp32", "bf16", "fp16"};
inline constexpr std::array<std::string_view, 3> kDevices{"cpu", "cuda", "kokkos"};  // a deck never names the meta device
template <> struct Choice<Attention> : EnumChoice<Attention, kAttentions> {};
template <> struct Choice<DataSource> : EnumChoice<DataSource, kDataSources> {};
template <> struct Choice<Offload> : EnumChoice<Offload, kOffloads> {};
template <> struct Choice<LrSchedule> : EnumChoice<LrSchedule, kLrSchedules> {};
template <> struct Choice<OnDivergence> : EnumChoice<OnDivergence, kOnDivergence> {};
template <> struct Choice<CommChoice> : EnumChoice<CommChoice, kCommChoices> {};
template <> struct Choice<GradReduce> : EnumChoice<GradReduce, kGradReduces> {};
template <> struct Choice<GradSync> : EnumChoice<GradSync, kGradSyncs> {};
template <> struct Choice<Recompute> : EnumChoice<Recompute, kRecomputes> {};
template <> struct Choice<core::Precision> : EnumChoice<core::Precision, kPrecisions> {};
template <> struct Choice<kernels::Device> : EnumChoice<kernels::Device, kDevices> {};

// Model families: the rows of models::families() (model.kind).
using ModelKind = const models::Family*;
template <>
struct Choice<ModelKind> {
  static std::vector<std::string_view> names();
  static ModelKind at(std::size_t i);
  static std::size_t index(ModelKind k);
};

// Pipeline schedules: the rows of strategies/pp's table.
using Schedule = const strategies::pp::ScheduleInfo*;
template <>
struct Choice<Schedule> {
  static std::vector<std::string_view> names();
  static Schedule at(std::size_t i);
  static std::size_t index(Schedule s);
};

// The deck's name of a value, and the value of a name (the program's own
// choices, e.g. a test's; a name that is not one is a bug, not bad input:
// decks are checked against Choice<T>::names() first).
template <typename T>
std::string_view name_of(const T& v) {
  return Choice<T>::names()[Choice<T>::index(v)];
}
template <typename T>
T choose(std::string_view name) {
  const auto names = Choice<T>::names();
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return Choice<T>::at(i);
  throw std::invalid_argument("not a choice: " + std::string(name));
}

struct RunSection {
  std::string name = "run";
  int steps = 10;
  int warmup_steps = 2;         // excluded from timing figures
  std::uint64_t seed = 1234;
  std::string output;           // report path; default results/<name>.h5
  bool profile = true;          // per-layer timeline spans
  int log_every = 1;            // print a table row every N steps (0: never)
  int flush_every = 0;          // steps of records kept before they go to the report (0: a 64 MiB window)
  OnDivergence on_divergence = OnDivergence::stop;
  int repeats = 1;              // strata sweep: runs of each point (the index shows median and spread)
  int keep_checkpoints = 3;     // the latest checkpoints kept in the directory (0: every one)
};

struct ModelSection {
  ModelKind kind = &models::find_family("gpt");
  int layers = 2;
  int d_model = 64;
  int heads = 4;
  int ffn_mult = 4;
  int vocab = 256;
  int seq_len = 64;
  Recompute recompute = Recompute::none;  // activation recomputation
  Attention attention = Attention::auto_;
  // Mixture of experts (moe_experts = 0: a dense model).
  int moe_experts = 0;
  int moe_every = 1;
  int moe_top_k = 2;
  double moe_capacity_factor = 1.25;
  bool moe_drop_tokens = true;
  bool moe_renormalize = true;
  double moe_aux_coef = 0.01;
  // Llama-style blocks (a family that takes them; the GPT's are fixed).
  int kv_heads = 0;            // key-value heads of grouped-query attention; 0: heads
  int ffn_dim = 0;             // the MLP's hidden units; 0: the family's rule
  double rope_theta = 500000;  // the base of the rotary positions' angles (Llama 3's)
  bool tie_embeddings = false;  // the head shares the token embedding's weights
};

struct DataSection {
  DataSource source = DataSource::synthetic;
  std::string path;                  // file for source = "text" (byte-level tokens)
  int global_batch = 8;              // sequences per optimizer step
  int micro_batch = 8;               // sequences per forward/backward
};

struct ParallelSection {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int ep = 1;
  int zero = 0;
  int dp_shard = 0;  // ZeRO's shard group: dp_shard consecutive dp ranks (0: all dp)
  int cp = 1;        // context-parallel ranks splitting each sequence
  double bucket_mb = 25.0;  // MiB, as PyTorch DDP's bucket_cap_mb
  bool overlap_grad_reduce = true;  // reduce gradients during the backward pass (Megatron-LM's flag)
  GradReduce grad_reduce = GradReduce::compute;  // gradients' precision under bf16 / fp16
  GradSync grad_sync = GradSync::auto_;           // when accumulated gradients are reduced
  // parallel.grad_sync resolved: whether gradients are reduced into their
  // shard after every micro-batch.
  bool reduce_every_micro_batch() const {
    return grad_sync == GradSync::auto_ ? zero >= 2 : grad_sync == GradSync::micro_batch;
  }
  Schedule schedule = &strategies::pp::find_schedule("1f1b");
  int virtual_stages = 1;
  int first_stage_layers = -1;  // -1: balanced
  int last_stage_layers = -1;
  bool sequence_parallel = false;
  Offload offload = Offload::none;
};

struct OptimSection {
  double lr = 3e-4;
  LrSchedule schedule = LrSchedule::constant;
  int warmup = 0;                     // linear warm-up steps of the lr schedule
  double min_lr = 0.0;                // cosine floor
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 0.0;             // 0: no clipping
};

struct BackendSection {
  kernels::Device device = kernels::Device::cpu;
  CommChoice comm = CommChoice::auto_;
  core::Precision precision = core::Precision::fp32;
  double loss_scale = 65536.0;        // fp16: initial dynamic loss scale
  int loss_scale_window = 1000;       // fp16: good steps in a row before the scale doubles
  int threads = 0;                    // 0: OMP_NUM_THREADS or all cores
  std::uint64_t memory_limit = 0;     // bytes; 0: no limit
  std::uint64_t host_memory_limit = 0;  // bytes of the host arena (offload); 0: no limit
  double peak_tflops = 0.0;           // 0: the machine's, else measured once per host (src/train/peak.hpp)
  std::string machine;                // a machine description whose device peak MFU uses; "": none
};

// NVMe offload (parallel.offload = "nvme"): where each rank's optimizer file
// lives and the chunks it streams through.
struct OffloadSection {
  std::string path;                   // a directory; required with "nvme"
  double chunk_mb = 4.0;              // MiB per state tensor per chunk
  bool params = false;                // ZeRO-3's parameter shard on NVMe too
};

struct Plan {
  RunSection run;
  ModelSection model;
  DataSection data;
  ParallelSection parallel;
  OptimSection optim;
  BackendSection backend;
  OffloadSection offload;
  // Micro-batches per rank and step: global_batch / (dp x micro_batch).
  int micro_batches() const { return data.global_batch / (parallel.dp * data.micro_batch); }
  // The fused attention kernels (model.attention, auto resolved by the device).
  bool fused_attention() const {
    return model.attention == Attention::fused ||
           (model.attention == Attention::auto_ && backend.device == kernels::Device::cuda);
  }
  // Unfused attention on the CUDA backend: batched products around the
  // causal softmax (kernels/unfused_attention.hpp); the CPU's and Kokkos'
  // own attention materialises the scores already.
  bool composed_attention() const { return backend.device == kernels::Device::cuda && !fused_attention(); }
};

}  // namespace strata::plan
