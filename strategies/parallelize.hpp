// One composition step: a run's parallel pieces, built from its plan and
// its mesh by the registry's rows, each adding what it owns (Row::compose):
// its layer seam, its groups' places in the state and the loss. The trainer
// takes what `parallelize` built and composes nothing itself; the model
// receives the seams as one bundle (models::Seams).
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "kernels/foundation/communicator.hpp"
#include "models/context_seam.hpp"
#include "models/expert_seam.hpp"
#include "models/seams.hpp"
#include "models/tensor_seam.hpp"

namespace strata::plan {
struct Plan;
}

namespace strata::strategies {

// A rank's communicators by group name (src/mesh's Mesh); null where it has
// no such group.
class MeshGroups {
 public:
  virtual ~MeshGroups() = default;
  virtual comm::Communicator* group(std::string_view name) const = 0;
};

// The groups of a single rank: none.
class NoGroups final : public MeshGroups {
 public:
  comm::Communicator* group(std::string_view) const override { return nullptr; }
};

// A run's parallel pieces. Every group is null where it would hold one rank.
struct Parallel {
  // The layer seams of every stage model: one rank until a row sets them.
  std::unique_ptr<models::TensorSeam> tp = std::make_unique<models::OneRank>();
  std::unique_ptr<models::ExpertSeam> ep = std::make_unique<models::OneExpertRank>();
  std::unique_ptr<models::ContextSeam> cp = std::make_unique<models::WholeSequence>();
  models::Seams seams() const { return {tp.get(), ep.get(), cp.get()}; }

  // The data-parallel ranks: each draws global_batch / dp sequences a step.
  comm::Communicator* data = nullptr;
  // The ranks holding the same parameters (dp, or dp x cp): the loss is
  // averaged, and the gradients reduced, over them.
  comm::Communicator* same_params = nullptr;
  // Hybrid sharding: the state's shard group and the replica group its
  // shards' gradients are all-reduced over.
  comm::Communicator *shard = nullptr, *replica = nullptr;
  // The expert-parallel ranks and the expert-data-parallel group their
  // units' state is kept over.
  comm::Communicator *experts = nullptr, *expert_data = nullptr;
  // The groups the squared gradient norm is summed over besides the state's:
  // they hold other parameters (tp, pp).
  std::vector<comm::Communicator*> norm;
  // The pipeline's communicator, and the group of the first and last stage,
  // which both hold the tied word embedding.
  comm::Communicator *pp = nullptr, *emb = nullptr;

  // The group the state strategy shards or replicates over.
  comm::Communicator* state() const { return shard != nullptr ? shard : same_params; }
};

// A group of more than one rank, else null.
inline comm::Communicator* several(comm::Communicator* c) { return c != nullptr && c->size() > 1 ? c : nullptr; }

// Every row's part, in the rows' order; `mesh` null: a single rank.
Parallel parallelize(const plan::Plan& p, const MeshGroups* mesh);

}  // namespace strata::strategies
