#include "strategies/state_strategy.hpp"

#include "kernels/foundation/error.hpp"
#include "strategies/ep.hpp"

namespace strata::strategies {

std::unique_ptr<StateStrategy> make_state_strategy(const StateConfig& cfg, const models::ParamRegistry& reg,
                                                   std::vector<models::Unit> units, comm::Communicator* dp,
                                                   core::MemoryTracker& tracker, comm::Communicator* ep,
                                                   comm::Communicator* edp) {
  STRATA_CHECK(cfg.make != nullptr, "a state strategy without its row's factory");
  if (ep != nullptr && ep->size() > 1)
    return std::make_unique<ExpertParallelState>(cfg, reg, std::move(units), dp, ep, edp, tracker, cfg.make);
  return cfg.make(cfg, reg, std::move(units), dp, tracker);
}

}  // namespace strata::strategies
