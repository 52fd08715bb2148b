// The GPT family's registry rows (models/model.hpp): "gpt" and "moe".
#pragma once

#include "models/decoder/decoder.hpp"
#include "models/model.hpp"

namespace strata::models {

// The decoder of a GPT plan: GPT-2 blocks of the plan's sizes (and fused
// attention on the CUDA backend).
DecoderConfig gpt_config(const plan::Plan& p);

Family gpt_family();
Family moe_family();

}  // namespace strata::models
