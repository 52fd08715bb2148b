// The model seam: what the trainer, the pipeline executor, the estimate and
// the simulator know of a model, whichever family built it. A family (the
// GPT and its Mixture-of-Experts form today) is a row of families(): its
// name (model.kind), the [model] keys it owns and their checks, how it
// builds one pipeline stage of its model, and how it counts its parameters
// and FLOPs. Adding a family is its folder and its row; nothing else names
// it.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/foundation/memory.hpp"
#include "kernels/foundation/timeline.hpp"
#include "models/buffers.hpp"
#include "models/moe.hpp"
#include "models/param_registry.hpp"
#include "models/seams.hpp"
#include "models/state.hpp"
#include "plan/checks.hpp"
#include "plan/keys.hpp"

namespace strata::models {

// A pipeline stage: blocks [first, last), and whether it holds the
// embedding (the first stage) and the final norm, head and loss (the last).
// The default is the whole model.
struct Stage {
  int first = 0;
  int last = -1;  // -1: every block
  bool embedding = true;
  bool head = true;
};
// Blocks per pipeline stage: `first` and `last` (>= 0) fix the first and
// the last stage's count (-1: balanced with the others, as Megatron's
// first/last pipeline-stage layer options), the rest spread evenly over the
// other stages, each of which must get at least one. A first stage of 0
// blocks holds the embedding alone; a last one, the head and loss alone.
std::vector<int> stage_block_counts(int layers, int stages, int first = -1, int last = -1);
// Stage `index` of `count` stages of a model of `layers` blocks so split.
Stage stage_of(int layers, int index, int count, int first = -1, int last = -1);

// One stage of a model over one micro-batch shape: its parameters, its
// activations (allocated once, when it is built) and one forward and one
// backward over a micro-batch.
class Model {
 public:
  virtual ~Model() = default;

  // This rank's parameters of the stage (its tensor-parallel and expert
  // slices) and their units for the state seam, in flat-buffer order.
  virtual const ParamRegistry& registry() const = 0;
  virtual const std::vector<Unit>& units() const = 0;
  virtual const Stage& stage() const = 0;
  // The buffers it allocated (activations, workspace), as its tracker
  // counts them.
  virtual const std::vector<BufferSpec>& buffers() const = 0;

  // A stage without the embedding reads its input activations here (fill
  // before forward); a stage without the head takes the gradient of its
  // output here (fill before backward), and after backward input_grad()
  // holds the gradient of its input. output() is the stage's output after
  // forward. Each is boundary_elements() elements in the run's format.
  virtual core::Ptr input() = 0;
  virtual core::CPtr output() const = 0;
  virtual core::Ptr output_grad() = 0;
  virtual core::CPtr input_grad() const = 0;
  virtual std::int64_t boundary_elements() const = 0;

  // tokens and targets are [B, T] (T this rank's tokens of each sequence).
  // Returns the mean loss over its tokens (0 on a stage without the head),
  // plus its blocks' auxiliary losses. Every forward is followed by a
  // backward.
  virtual float forward(ParamState& state, const std::int32_t* tokens, const std::int32_t* targets,
                        prof::Timeline* tl = nullptr) = 0;
  // Backward of (mean loss x loss_scale) for the last forward; parameter
  // gradients accumulate into the state's. With `input_only` (a model built
  // with a split backward) only the gradients of the stage's input and of
  // what the weight half cannot wait for; backward_weight() then adds the
  // rest and says the units are done.
  virtual void backward(ParamState& state, const std::int32_t* tokens, const std::int32_t* targets, float loss_scale,
                        prof::Timeline* tl = nullptr, bool input_only = false) = 0;
  virtual void backward_weight(ParamState& state, prof::Timeline* tl = nullptr) = 0;

  // Whether the output head is the token embedding: the first and the last
  // stage then each hold a copy, whose gradients are summed.
  virtual bool tied_head() const = 0;

  // The routing layers of the stage and their global block (for the
  // /experts table); none in a dense model.
  virtual std::vector<std::pair<int, const MoeLayer*>> routers() const { return {}; }
};

// What a family builds a stage model with, besides the plan.
struct Build {
  int micro_batch = 1;
  core::MemoryTracker* tracker = nullptr;
  Seams seams = {};   // where its layers meet other ranks (strategies::parallelize)
  Stage stage = {};   // its part of the pipeline
  bool split_backward = false;  // backward in two halves (a zero-bubble schedule)
  Scratch* scratch = nullptr;   // the rank's shared scratch (models/buffers.hpp); null: its own
};

// A model family: a registry row chosen by model.kind.
struct Family {
  std::string_view name = {};
  std::string_view doc = {};
  std::vector<plan::KeySpec> keys = {};  // the [model] keys it owns
  plan::PlanCheck check = nullptr;       // constraints on its keys
  std::unique_ptr<Model> (*make)(const plan::Plan& p, const Build& b) = nullptr;
  // The whole model's parameter count, in long double: what a deck's sizes
  // are checked against before any int is computed from them.
  long double (*parameters)(const plan::Plan& p) = nullptr;
  // FLOPs of a forward and backward over `sequences` sequences: the model's
  // (3x the forward's matrix products, attention over the full T x T square
  // as Megatron counts it), and those executed with recomputation.
  double (*model_flops)(const plan::Plan& p, int sequences) = nullptr;
  double (*hardware_flops)(const plan::Plan& p, int sequences) = nullptr;
};

// Every family, in the order model.kind lists them (models/families.cpp).
const std::vector<Family>& families();
const Family& family(const plan::Plan& p);
// The whole model's parameters (the deck's checks have kept them below 2^53).
std::int64_t parameter_count(const plan::Plan& p);

// The deck keys of the model families: model.kind, then every family's own
// (a key two families take, once).
std::vector<plan::KeySpec> model_keys();
// Whether family f takes [model] key `name` ("kv_heads"), and the families
// that do (none: a key every family takes, as layers).
bool takes_key(const Family& f, std::string_view name);
std::vector<std::string_view> families_taking(std::string_view name);

}  // namespace strata::models
