#include "strategies/state_strategy.hpp"

#include "strategies/dp.hpp"
#include "strategies/zero.hpp"

namespace strata::strategies {

std::unique_ptr<StateStrategy> make_state_strategy(const StateConfig& cfg, const models::Gpt& model,
                                                   comm::Communicator* dp, core::MemoryTracker& tracker) {
  if (cfg.zero == 0) return std::make_unique<DataParallel>(cfg, model, dp, tracker);
  return std::make_unique<Zero>(cfg, model, dp, tracker);
}

}  // namespace strata::strategies
