// The resolved configuration of a run: what a deck says after defaults,
// overrides and validation. Section and key names follow the deck exactly
// (docs/decks.md), since sweeps and tests address keys as "section.key".
#pragma once

#include <cstdint>
#include <string>

namespace strata::deck {

struct RunSection {
  std::string name = "run";
  int steps = 10;
  int warmup_steps = 2;         // excluded from timing figures
  std::uint64_t seed = 1234;
  std::string output;           // report path; default results/<name>.h5
  bool profile = true;          // per-layer timeline spans
  int log_every = 1;            // print a table row every N steps (0: never)
};

struct ModelSection {
  std::string kind = "gpt";
  int layers = 2;
  int d_model = 64;
  int heads = 4;
  int ffn_mult = 4;
  int vocab = 256;
  int seq_len = 64;
  std::string recompute = "none";  // activation recomputation: none, selective, full
  // Mixture of experts (moe_experts = 0: a dense model).
  int moe_experts = 0;
  int moe_every = 1;
  int moe_top_k = 2;
  double moe_capacity_factor = 1.25;
  bool moe_drop_tokens = true;
  bool moe_renormalize = true;
  double moe_aux_coef = 0.01;
};

struct DataSection {
  std::string source = "synthetic";  // "synthetic" | "text"
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
  double bucket_mb = 25.0;  // MiB, as PyTorch DDP's bucket_cap_mb
  std::string schedule = "1f1b";
  int virtual_stages = 1;
  int first_stage_layers = -1;  // -1: balanced
  int last_stage_layers = -1;
  bool sequence_parallel = false;
  std::string offload = "none";
};

struct OptimSection {
  double lr = 3e-4;
  std::string schedule = "constant";  // "constant" | "cosine"
  int warmup = 0;                     // linear warm-up steps of the lr schedule
  double min_lr = 0.0;                // cosine floor
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 0.0;             // 0: no clipping
};

struct BackendSection {
  std::string device = "cpu";
  std::string comm = "auto";          // auto: nccl on cuda, mpi on cpu
  std::string precision = "fp32";
  double loss_scale = 65536.0;        // fp16: initial dynamic loss scale
  int loss_scale_window = 1000;       // fp16: good steps in a row before the scale doubles
  int threads = 0;                    // 0: OMP_NUM_THREADS or all cores
  std::uint64_t memory_limit = 0;     // bytes; 0: no limit
  std::uint64_t host_memory_limit = 0;  // bytes of the host arena (offload); 0: no limit
  double peak_tflops = 0.0;           // 0: measure an sgemm at start-up
};

// NVMe offload (parallel.offload = "nvme"): where each rank's optimizer file
// lives and the chunks it streams through.
struct OffloadSection {
  std::string path;                   // a directory; required with "nvme"
  double chunk_mb = 4.0;              // MiB per state tensor per chunk
  bool params = false;                // ZeRO-3's parameter shard on NVMe too
};

struct Config {
  RunSection run;
  ModelSection model;
  DataSection data;
  ParallelSection parallel;
  OptimSection optim;
  BackendSection backend;
  OffloadSection offload;
};

}  // namespace strata::deck
