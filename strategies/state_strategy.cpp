#include "strategies/state_strategy.hpp"

#include "strategies/dp.hpp"
#include "strategies/ep.hpp"
#include "strategies/zero.hpp"

namespace strata::strategies {

namespace {

std::unique_ptr<StateStrategy> make_one(const StateConfig& cfg, const models::ParamRegistry& reg,
                                        std::vector<models::Unit> units, comm::Communicator* group,
                                        core::MemoryTracker& tracker) {
  if (cfg.zero == 0) return std::make_unique<DataParallel>(cfg, reg, std::move(units), group, tracker);
  return std::make_unique<Zero>(cfg, reg, std::move(units), group, tracker);
}

}  // namespace

std::unique_ptr<StateStrategy> make_state_strategy(const StateConfig& cfg, const models::ParamRegistry& reg,
                                                   std::vector<models::Unit> units, comm::Communicator* dp,
                                                   core::MemoryTracker& tracker, comm::Communicator* ep,
                                                   comm::Communicator* edp) {
  if (ep != nullptr && ep->size() > 1)
    return std::make_unique<ExpertParallelState>(cfg, reg, std::move(units), dp, ep, edp, tracker, make_one);
  return make_one(cfg, reg, std::move(units), dp, tracker);
}

}  // namespace strata::strategies
