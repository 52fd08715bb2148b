// What a rank's action list keeps alive, computed once from the list: the
// pipeline executor allocates its stage models (one per micro-batch in
// flight on a chunk) from it, the dry run's estimate is that allocation run
// on the meta device, and the unit-cost simulator enforces the same bound.
//
// A (chunk, micro-batch) pair is live from its first action (the receive of
// its activations, or its forward on the first stage) to its last (the send
// of its input gradient, its backward on the first stage, or the weight half
// of a split backward). Its stage model holds the pair's activations all
// that time, and a little longer: until the sends of its last actions have
// completed.
#pragma once

#include <vector>

#include "strategies/pp/schedule.hpp"

namespace strata::strategies::pp {

struct Liveness {
  // Per chunk: the most pairs live at once at any action, the stage models
  // the chunk needs.
  std::vector<int> slots;
  // Per action: whether it is the first, resp. the last, action of its pair
  // (false for the optimizer), and whether it completes its chunk's
  // gradients for the step (the chunk's last backward or weight half).
  std::vector<char> first_of_pair, last_of_pair, completes_chunk;
  // Over all chunks: the most pairs live at once.
  int most_live = 0;
  // The list splits backward passes into input and weight halves.
  bool split_backward = false;
};

// Of one rank's action list (its chunks are those its actions name).
Liveness liveness(const std::vector<Action>& actions);

}  // namespace strata::strategies::pp
