// The Llama family's registry row (models/model.hpp): "llama".
#pragma once

#include "models/decoder/decoder.hpp"
#include "models/model.hpp"

namespace strata::models {

Family llama_family();

// The decoder of a llama plan: pre-RMSNorm blocks without biases,
// grouped-query attention with rotary positions, a SwiGLU MLP (or
// Mixtral-style MoE blocks of SwiGLU experts), and an untied head unless
// the plan ties it.
DecoderConfig llama_config(const plan::Plan& p);

// Llama's default MLP width for a residual stream of d_model: 8 d_model / 3
// (SwiGLU's three matrices then hold what a GELU MLP of 4 d_model holds in
// two), rounded up to a multiple of 256.
long long llama_ffn_dim(long long d_model);

}  // namespace strata::models
