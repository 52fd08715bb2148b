// The per-rank timeline: forward, backward and optimizer spans with their
// step, micro-batch, chunk and layer, stamped with the profiling clock. Recording a
// span is a clock read and a push into a pre-reserved vector, so profiling
// stays cheap; when disabled nothing is read at all.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/foundation/clock.hpp"
#include "kernels/foundation/trace.hpp"

namespace strata::prof {

// backward_input and backward_weight: the two halves of a backward pass that
// a zero-bubble pipeline schedule runs apart.
enum class Phase : std::int8_t { forward = 0, backward = 1, optimizer = 2, backward_input = 3, backward_weight = 4 };
const char* phase_name(Phase p);

struct Span {
  std::int32_t step;
  std::int32_t micro_batch;
  std::int32_t chunk;  // the pipeline rank's model chunk (interleaved schedules; else 0)
  std::int32_t layer;  // 0 embedding, 1..L blocks, L+1 head and loss, -1 whole-model work
  Phase phase;
  double start;        // seconds since the timeline's origin
  double end;
};

class Timeline {
 public:
  explicit Timeline(bool enabled = true, double origin = now_seconds()) : enabled_(enabled), origin_(origin) {}
  bool enabled() const { return enabled_; }
  void set_position(int step, int micro_batch, int chunk = 0) {
    step_ = step;
    micro_batch_ = micro_batch;
    chunk_ = chunk;
  }
  int micro_batch() const { return micro_batch_; }
  int chunk() const { return chunk_; }
  void reserve(std::size_t n) { spans_.reserve(n); }
  // Drops the spans kept so far, keeping their room: a run's spans once
  // they are written to its report.
  void clear() { spans_.clear(); }
  // A span with its times given (a simulated timeline).
  void add(const Span& s) { spans_.push_back(s); }
  double origin() const { return origin_; }
  // Called at both ends of every span: on a GPU, a wait for the kernels
  // launched so far, so that a span covers its layer's execution and not only
  // the launches (the kernels run in one stream, so the waits cost launch
  // latency, not overlap). Null on the CPU.
  void set_fence(void (*fence)()) { fence_ = fence; }
  void fence() const {
    if (fence_ != nullptr) fence_();
  }
  // Only meaningful when enabled; callers skip the clock read otherwise.
  void record(int layer, Phase phase, double start, double end) {
    spans_.push_back(Span{step_, micro_batch_, chunk_, layer, phase, start - origin_, end - origin_});
  }
  const std::vector<Span>& spans() const { return spans_; }

 private:
  bool enabled_;
  double origin_;
  void (*fence_)() = nullptr;
  int step_ = 0, micro_batch_ = 0, chunk_ = 0;
  std::vector<Span> spans_;
};

// Where the work of this thread is now, whether or not a timeline records
// it: the layer and phase of the innermost span, and whether a backward pass
// is recomputing its forward. The meta device attributes each kernel's cost
// to it (kernels/kernels.hpp, meta_costs).
struct Work {
  int layer = -1;
  Phase phase = Phase::optimizer;
  bool recompute = false;
  bool host = false;  // offloaded work that the host's cores run, not the device
};
inline Work& current_work() {
  thread_local Work w;
  return w;
}

// Marks a backward pass's rebuilding of its forward (activation
// recomputation) for the scope.
class Recomputing {
 public:
  Recomputing() : saved_(current_work().recompute) { current_work().recompute = true; }
  ~Recomputing() { current_work().recompute = saved_; }
  Recomputing(const Recomputing&) = delete;
  Recomputing& operator=(const Recomputing&) = delete;

 private:
  bool saved_;
};

// Marks work the host runs for the scope (offload's optimizer update).
class OnHost {
 public:
  explicit OnHost(bool host = true) : saved_(current_work().host) { current_work().host = host || saved_; }
  ~OnHost() { current_work().host = saved_; }
  OnHost(const OnHost&) = delete;
  OnHost& operator=(const OnHost&) = delete;

 private:
  bool saved_;
};

// Records [construction, destruction) as one span when the timeline is on,
// and is where the thread's work is for the while (current_work).
class ScopedSpan {
 public:
  ScopedSpan(Timeline* tl, int layer, Phase phase)
      : tl_(tl != nullptr && tl->enabled() ? tl : nullptr), pos_(tl), layer_(layer), phase_(phase),
        start_(tl_ ? (tl_->fence(), now_seconds()) : 0.0), saved_(current_work()) {
    current_work() = Work{layer, phase, false};
    if (current_trace() != nullptr) trace(TraceEvent::Kind::span_begin);
  }
  ~ScopedSpan() {
    if (current_trace() != nullptr) trace(TraceEvent::Kind::span_end);
    current_work() = saved_;
    if (tl_) {
      tl_->fence();
      tl_->record(layer_, phase_, start_, now_seconds());
    }
  }
  ScopedSpan(const ScopedSpan&) = delete;
  ScopedSpan& operator=(const ScopedSpan&) = delete;

 private:
  // A dry run's trace gets the span's ends, with the timeline's position.
  void trace(TraceEvent::Kind kind) const {
    TraceEvent e;
    e.kind = kind;
    e.layer = layer_;
    e.phase = phase_;
    if (pos_ != nullptr) e.micro_batch = pos_->micro_batch(), e.chunk = pos_->chunk();
    current_trace()->events.push_back(e);
  }
  Timeline* tl_;
  const Timeline* pos_;  // where the trainer is (micro-batch, chunk), recording or not
  int layer_;
  Phase phase_;
  double start_;
  Work saved_;
};

inline const char* phase_name(Phase p) {
  switch (p) {
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::optimizer: return "optimizer";
    case Phase::backward_input: return "backward_input";
    case Phase::backward_weight: return "backward_weight";
  }
  return "?";
}

}  // namespace strata::prof
