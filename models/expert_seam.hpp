// The layer seam of expert parallelism: where a MoE layer's tokens meet the
// ranks that hold the other experts (GShard's dispatch and combine). The MoE
// layer (models/moe.cpp) is written once against this interface; the plain
// form is one rank holding every expert (exchanges are copies), the parallel
// form strategies/ep.cpp's, built by the registry's ep row: all-to-all over
// the ep group.
#pragma once

#include <cstdint>

#include "kernels/foundation/ptr.hpp"

namespace strata::models {

class ExpertSeam {
 public:
  virtual ~ExpertSeam() = default;
  // Ranks the experts are split over, and this one (it holds experts
  // [rank E / size, (rank + 1) E / size)).
  virtual int size() const { return 1; }
  virtual int rank() const { return 0; }
  // Block p of `send` (`per_peer` int32 each) to rank p; block p of `recv`
  // from rank p.
  virtual void exchange_counts(const std::int32_t* send, std::int32_t* recv, std::int64_t per_peer);
  // Elements (of the tensors' format) to and from every rank:
  // send_counts[p] from send + send_displs[p] to rank p, recv_counts[p] from
  // rank p into recv + recv_displs[p]. Both buffers hold `extent` elements
  // (a MoE layer's slots).
  virtual void exchange(core::CPtr send, const std::int64_t* send_counts, const std::int64_t* send_displs,
                        core::Ptr recv, const std::int64_t* recv_counts, const std::int64_t* recv_displs,
                        std::int64_t extent);
};

// One rank holding every expert.
class OneExpertRank : public ExpertSeam {};
ExpertSeam& one_expert_rank();

}  // namespace strata::models
