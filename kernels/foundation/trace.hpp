// A rank's step as a program: the ordered list of what it did on the meta
// device (kernels with their cost, the spans of the timeline, collectives
// and the waits for non-blocking ones), recorded while a dry run executes
// the real code. The simulator (src/sim/simulator.hpp) replays it with
// durations from a machine description, so the work it times is the work the
// code declares by running, never a second description of it.
//
// Recording is per thread: the thread that installs a trace (TraceScope)
// records into it; other threads (offload's copy threads) record nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::prof {

enum class Phase : std::int8_t;  // kernels/foundation/timeline.hpp

// One collective or point-to-point call. Bytes follow the /comm table's
// convention (docs/report-schema.md): all_reduce the buffer, reduce_scatter
// the whole input, all_gather the whole output, the rest what this rank sends.
struct TraceComm {
  std::string op;
  std::string axis;
  int group_size = 1;
  int rank = 0;   // this rank's place in the group
  std::int64_t bytes = 0;
  int peer = -1;  // send, recv: the other rank, in the group
  int tag = 0;
  bool nonblocking = false;
};

struct TraceEvent {
  enum class Kind : std::int8_t { kernel, span_begin, span_end, comm, wait };
  Kind kind = Kind::kernel;
  // kernel: its name (kernels/ops.inc) and cost; the GEMM shape (0 otherwise).
  const char* name = "";
  double matmul_flops = 0, other_flops = 0, bytes = 0;
  int m = 0, n = 0, k = 0;
  bool recompute = false;
  bool host = false;  // run by the host's cores (offload), not the device
  // span_begin, span_end: as the timeline's spans.
  int micro_batch = 0, chunk = 0, layer = -1;
  Phase phase{};
  // comm: its index in Trace::comms; wait: the index of the non-blocking
  // call waited for.
  int comm = -1;
};

struct Trace {
  std::vector<TraceEvent> events;
  std::vector<TraceComm> comms;
};

// The trace this thread records into, or null.
inline Trace*& current_trace() {
  thread_local Trace* t = nullptr;
  return t;
}

// Installs `t` as the thread's trace for the scope.
class TraceScope {
 public:
  explicit TraceScope(Trace* t) : saved_(current_trace()) { current_trace() = t; }
  ~TraceScope() { current_trace() = saved_; }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  Trace* saved_;
};

// Records a call and returns its index (for a later trace_wait), or -1
// when no trace is installed.
inline int trace_comm(TraceComm c) {
  Trace* t = current_trace();
  if (t == nullptr) return -1;
  t->comms.push_back(std::move(c));
  TraceEvent e;
  e.kind = TraceEvent::Kind::comm;
  e.comm = int(t->comms.size()) - 1;
  t->events.push_back(e);
  return e.comm;
}

// A transfer the rank starts and later waits for that is not a collective:
// offload's copies between device and host (axis "host") and its reads and
// writes of the NVMe file (axis "nvme").
inline int trace_transfer(const char* op, const char* axis, std::int64_t bytes) {
  return trace_comm({op, axis, 1, 0, bytes, -1, 0, true});
}

inline void trace_wait(int comm) {
  Trace* t = current_trace();
  if (t == nullptr || comm < 0) return;
  TraceEvent e;
  e.kind = TraceEvent::Kind::wait;
  e.comm = comm;
  t->events.push_back(e);
}

}  // namespace strata::prof
