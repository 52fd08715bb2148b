#include "strategies/state_strategy.hpp"

#include "strategies/dp.hpp"
#include "strategies/zero.hpp"

namespace strata::strategies {

std::unique_ptr<StateStrategy> make_state_strategy(const StateConfig& cfg, const models::ParamRegistry& reg,
                                                   std::vector<models::Unit> units, comm::Communicator* dp,
                                                   core::MemoryTracker& tracker) {
  if (cfg.zero == 0) return std::make_unique<DataParallel>(cfg, reg, std::move(units), dp, tracker);
  return std::make_unique<Zero>(cfg, reg, std::move(units), dp, tracker);
}

}  // namespace strata::strategies
