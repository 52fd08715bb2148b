// The pipeline executor: one pipeline rank's chunks of the model and its
// action list of a schedule (strategies/pp/schedule.hpp), run on real stage
// models and the pipeline communicator. The schedule's row says where each
// chunk sits (its placement) and the list's liveness (liveness.hpp) how many
// stage models each chunk needs; all are built at once, so a step allocates
// nothing for them and what a rank holds is the schedule's, not the
// timing's. The unit-cost simulator (src/sim) runs the same lists.
//
// Each (chunk, micro-batch) pair in flight needs its own activations, so a
// stage model is taken when the pair's activations arrive (or its embedding
// runs) and given back once the last action of the pair ran and its sends
// completed. When a pair starts and none is free, one still holds a pair
// whose last sends are in flight: the executor waits for the oldest such
// send (the simulator checks that no schedule deadlocks or stalls so). Sends
// are non-blocking (the schedules are deadlock-free when sends never block);
// a receive is a probe then the receive, so the communicator records how
// long it waited for the peer apart from the transfer. Activations and their
// gradients travel in their format (the compute precision), from and into
// the stage models' own buffers. A stage model holds its activations only:
// the scratch its passes use is the rank's, one for all (models::Scratch).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/foundation/communicator.hpp"
#include "kernels/foundation/timeline.hpp"
#include "models/model.hpp"
#include "strategies/pp/liveness.hpp"
#include "strategies/pp/schedule.hpp"
#include "strategies/state_strategy.hpp"

namespace strata::strategies::pp {

class Executor {
 public:
  // A stage model of global stage `stage`, split backward or not.
  using MakeModel = std::function<std::unique_ptr<models::Model>(int stage, bool split_backward)>;
  // Rank `rank` of `shape` under `row`, its transfers of a stage model's
  // boundary_elements() each way on `pp`.
  Executor(const ScheduleInfo& row, const Shape& shape, int rank, comm::Communicator& pp, const MakeModel& make);

  int chunks() const { return int(chunks_.size()); }
  models::Model& model(int chunk) { return *chunks_[std::size_t(chunk)].slots[0]; }
  // Whether this rank holds the first stage (the embedding reads the batch)
  // or the last (the loss reads the targets).
  bool holds_embedding() const { return chunks_.front().slots[0]->stage().embedding; }
  bool holds_head() const { return chunks_.back().slots[0]->stage().head; }
  // Stage models built, over every chunk.
  std::size_t stage_models() const;

  // Appends the chunks' parameters and units to the rank's layout, chunk
  // after chunk: the flat layout of the rank's state strategy.
  void lay_out(models::ParamRegistry& reg, std::vector<models::Unit>& units);
  // The strategy the chunks read and write through (built over that
  // layout); with several chunks each sees its own units.
  void use_state(StateStrategy& strategy);

  // Runs the step's actions. Micro-batch mb's token ids and targets are at
  // tokens + mb * B * T and targets + mb * B * T (read on the first and the
  // last stage). `on_forward` sees every stage model after its forward.
  // Returns the loss summed over the step's micro-batches (all-reduced over
  // the pipeline: only the last stage computes it).
  double run(int step, float loss_scale, const std::int32_t* tokens, const std::int32_t* targets, std::int64_t batch,
             prof::Timeline* timeline, const std::function<void(const models::Model&)>& on_forward);

 private:
  struct Chunk {
    int first_unit = 0;                          // of the chunk's units in the rank's state
    std::unique_ptr<models::ShiftedState> view;  // the chunk's units, when the rank has several chunks
    std::vector<std::unique_ptr<models::Model>> slots;
    std::vector<models::Model*> free;
    std::vector<models::Model*> of_mb;             // the stage model holding each micro-batch of the step
  };
  models::ParamState& state_of(int chunk);

  Shape shape_;
  comm::Communicator& pp_;
  std::vector<Action> actions_;
  Liveness live_;
  std::vector<Chunk> chunks_;
  StateStrategy* strategy_ = nullptr;
};

}  // namespace strata::strategies::pp
