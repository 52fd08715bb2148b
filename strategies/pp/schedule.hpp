// Pipeline schedules as data (the schedule seam). A schedule is a pure
// function of (stages p, micro-batches m, virtual stages v) to one list of
// actions per pipeline rank: compute (forward, backward, or backward-input
// and backward-weight for zero-bubble schedules), the sends and receives of
// activations and gradients around it, and the optimizer step. The real
// executor and the simulator run the same lists; being data, schedules are
// tested without MPI (strategies/pp/check.hpp).
//
// With v virtual stages, rank r holds model chunks c = 0..v-1; where chunk c
// of rank r sits in the model (its global stage) is the schedule's placement,
// a property of its row: Megatron's interleaving (stage c * p + r), or ZB-V's
// V (stages r and 2p - 1 - r). Activations flow from stage s to s + 1,
// gradients back.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>


namespace strata::strategies::pp {

enum class Op : std::uint8_t {
  forward,          // F(mb, chunk)
  backward,         // B(mb, chunk): input and weight gradients together
  backward_input,   // the input-gradient half of B (zero-bubble schedules)
  backward_weight,  // the weight-gradient half of B
  send_act,         // activations of (mb, chunk) to the next stage's rank
  recv_act,         // activations of (mb, chunk) from the previous stage's rank
  send_grad,        // input gradient of (mb, chunk) to the previous stage's rank
  recv_grad,        // output gradient of (mb, chunk) from the next stage's rank
  optimizer,
};
const char* op_name(Op op);

struct Action {
  Op op;
  int mb = -1;
  int chunk = 0;
  int peer = -1;  // pipeline rank at the other end of a send or receive
  bool operator==(const Action&) const = default;
};

struct Shape {
  int p = 1;  // pipeline ranks
  int m = 1;  // micro-batches per step
  int v = 1;  // model chunks per rank (interleaved only)
};

// One list per pipeline rank, in execution order.
using Schedule = std::vector<std::vector<Action>>;

// The compute order of one rank (forward/backward actions only): what a
// schedule generator decides. add_communication() turns it into a Schedule.
using ComputeOrder = std::vector<std::vector<Action>>;

ComputeOrder gpipe(const Shape& s);
ComputeOrder one_f_one_b(const Shape& s);
ComputeOrder interleaved_1f1b(const Shape& s);
ComputeOrder zb_h1(const Shape& s);
// ZB-V (strategies/pp/zb_v.cpp): two chunks per rank as a V, list-scheduled
// at unit costs; its bubble at unit costs, and its shape constraint (v = 2).
ComputeOrder zb_v(const Shape& s);
double zb_v_bubble(const Shape& s);
std::string zb_v_shape(const Shape& s);

// Where the model chunks sit: the global stage of chunk c of rank r, and the
// rank holding a stage (its inverse, chunk by chunk).
struct Placement {
  const char* name;
  int (*stage_of)(const Shape& s, int rank, int chunk);
  int (*rank_of)(const Shape& s, int stage);
};
// Megatron's interleaving: chunk c of rank r is stage c p + r (with one
// chunk, stage r).
extern const Placement kInterleaved;
// ZB-V's: chunk 0 of rank r is stage r, chunk 1 stage 2p - 1 - r.
extern const Placement kV;

// Receives before, sends after every compute action (first and last global
// stages excepted, by `placement`), and the optimizer step at the end of
// every list.
Schedule add_communication(const ComputeOrder& order, const Shape& s, const Placement& placement = kInterleaved);

// A row of the schedule seam: everything a schedule is, in one place.
// Adding a schedule is its generator (a file) and a row in schedules().
struct ScheduleInfo {
  const char* name;
  std::function<ComputeOrder(const Shape&)> generate;
  // Theoretical bubble fraction for unit costs (forward 1, backward 2, or
  // 1 + 1 when split): GPipe and 1F1B (p-1)/(m+p-1); interleaved
  // (p-1)/(v m+p-1); ZB-H1 (p-1)/(3m+p-1) (its bubble is (p-1)(F+B-W)).
  std::function<double(const Shape&)> bubble;
  const char* formula;  // of the bubble, for people
  bool virtual_stages;  // uses v > 1
  const Placement* placement = &kInterleaved;
  // Its constraints on (p, m, v) beyond each >= 1 and v == 1 without
  // virtual stages: what is wrong, or "".
  std::string (*shape_problem)(const Shape& s) = nullptr;
  // Its backward runs in two halves, input then weight gradients (the
  // zero-bubble schedules): stage models keep each linear's output gradient
  // between them (models/model.hpp), which recomputation does not compose
  // with (strategies/conflicts.cpp).
  bool split_backward = false;
  // What its stage models hold, for people (the liveness of its lists).
  const char* memory = "";
};
const std::vector<ScheduleInfo>& schedules();
const ScheduleInfo& find_schedule(const std::string& name);  // runtime error if unknown

// Shape constraints of a schedule, as a message naming the violated one
// ("" if the shape is allowed).
std::string check_shape(const ScheduleInfo& row, const Shape& s);
inline std::string check_shape(const std::string& name, const Shape& s) { return check_shape(find_schedule(name), s); }

Schedule make_schedule(const ScheduleInfo& row, const Shape& s);
inline Schedule make_schedule(const std::string& name, const Shape& s) { return make_schedule(find_schedule(name), s); }

}  // namespace strata::strategies::pp
