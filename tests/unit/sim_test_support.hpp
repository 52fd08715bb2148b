// What the simulator's tests share: a small machine description with
// every figure set (four devices per node, so groups of more span nodes)
// and a tiny deck to vary with --set style overrides.
#pragma once

#include <string>
#include <vector>

#include "src/deck/deck.hpp"
#include "src/sim/machine.hpp"

namespace strata::test {

inline const char* kMachine = R"(name = "unit"
devices_per_node = 4
[device]
kind = "gpu"
memory_gib = 16
host_memory_gib = 64
peak_tflops_fp32 = 10
peak_tflops_bf16 = 100
peak_tflops_fp16 = 100
matmul_efficiency = 0.5
matmul_half_dim = 64
vector_tflops = 5
memory_bandwidth_gbs = 1000
launch_latency_us = 2
host_link_gbs = 20
[network]
overlap = 1.0
[network.node]
bandwidth_gbs = 100
latency_us = 3
[network.cluster]
bandwidth_gbs = 40
latency_us = 7
[host]
vector_tflops = 0.5
memory_bandwidth_gbs = 50
)";

inline sim::Machine unit_machine() { return sim::parse_machine("unit.toml", kMachine); }

// Two blocks of width 16, 8 tokens, 4 micro-batches of 2, fp32, one thread.
inline plan::Plan tiny(const std::vector<std::string>& sets) {
  const std::string text =
      "[run]\nsteps = 3\nwarmup_steps = 0\nseed = 11\n"
      "[model]\nlayers = 2\nd_model = 16\nheads = 2\nvocab = 32\nseq_len = 8\n"
      "[data]\nglobal_batch = 8\nmicro_batch = 2\n"
      "[optim]\nlr = 3e-3\n"
      "[backend]\nthreads = 1\n";
  return deck::parse_deck("tiny.toml", text, sets).config;
}

}  // namespace strata::test
