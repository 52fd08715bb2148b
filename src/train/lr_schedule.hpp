// Learning-rate schedules: constant, or cosine decay to optim.min_lr; both
// with a linear warm-up over optim.warmup steps.
#pragma once

#include "plan/plan.hpp"

namespace strata::train {

// Learning rate of 0-based step `step` of a run of `total_steps`.
double learning_rate(const plan::OptimSection& o, int step, int total_steps);

}  // namespace strata::train
