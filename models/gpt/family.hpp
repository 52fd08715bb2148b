// The GPT family's registry rows (models/model.hpp): "gpt" and "moe".
#pragma once

#include "models/model.hpp"

namespace strata::models {

Family gpt_family();
Family moe_family();

}  // namespace strata::models
