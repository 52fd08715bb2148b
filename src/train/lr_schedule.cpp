#include "src/train/lr_schedule.hpp"

#include <algorithm>
#include <cmath>

namespace strata::train {

double learning_rate(const plan::OptimSection& o, int step, int total_steps) {
  if (step < o.warmup) return o.lr * double(step + 1) / double(o.warmup);
  if (o.schedule == plan::LrSchedule::constant) return o.lr;
  const int decay_steps = std::max(1, total_steps - o.warmup);
  const double progress = std::min(1.0, double(step - o.warmup) / double(decay_steps));
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace strata::train
