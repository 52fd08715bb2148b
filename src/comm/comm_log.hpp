// The communication log of one rank: one record per call that passed through
// a profiled communicator. The trainer sets the current step; the report
// writes the records as the /comm table and aggregates them per axis and op.
#pragma once

#include <cstdint>
#include <string_view>
#include <string>
#include <vector>

namespace strata::comm {

struct CommRecord {
  std::int32_t step;
  std::string op;        // "all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all",
                         // "all_to_allv", "send", "recv", "barrier"
  std::string axis;      // the communicator's axis: the name of its group in the layout (strategies/axes.hpp)
  std::int32_t group_size;
  std::int64_t bytes;    // see docs/report-schema.md: all_reduce the buffer; reduce_scatter the
                         // whole input; all_gather the whole output; all_to_all(v) what this rank sends
  bool nonblocking;
  double start;          // s since the log's origin: when the call was issued
  double end;            // when it was known complete (blocking: returned; non-blocking: wait/test saw it done)
  double wait;           // s spent blocked: the whole call if blocking, else the time inside wait()/test()
  double peer_wait = 0;  // recv: the part of wait before the peer's message arrived (the rest is the transfer)
  // The transfer itself, within [start, end], as far as the backend can
  // tell: on a GPU the operation's own span on its stream; a blocking call
  // on the host, the call (a receive from when its message had arrived); a
  // non-blocking MPI call, its share of the time this rank spent inside MPI
  // while it was in flight (comm::HostProgress), ending when it was seen
  // complete: MPI without a progress thread moves data only inside its
  // calls, so the rest of the span was compute the transfer did not overlap.
  double transfer_start = 0, transfer_end = 0;
  int peer = -1;  // send, recv: the other rank, in the communicator's group; -1 for collectives
  int tag = -1;   // send, recv: the message tag (with the peer, what pairs a send with its receive)
  // The transfer is the host estimate above (HostProgress), which the report
  // refines across the group (not written to the report).
  bool host_estimate = false;
  double span() const { return end - start; }
  double transfer() const { return transfer_end - transfer_start; }
};

// The nccl-tests bus-bandwidth factor: the bytes each rank's busiest link
// carries per byte of the call (the /comm convention), so that bytes x factor
// / time compares with a link's bandwidth: all_reduce 2(n-1)/n, all_gather,
// reduce_scatter and all_to_all(v) (n-1)/n, others 1; 0 for a group of one.
inline double busbw_factor(const std::string& op, int n) {
  if (n <= 1) return 0;
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all" || op == "all_to_allv")
    return double(n - 1) / n;
  return 1.0;
}

// Sets of time as sorted, disjoint [t0, t1] intervals.
using Intervals = std::vector<std::pair<double, double>>;
// Sorted by start, overlapping intervals joined.
Intervals merged(Intervals v);
// The times in both `a` and `b` (each sorted and disjoint; so is the result).
Intervals intersect(const Intervals& a, const Intervals& b);
// How much of [t0, t1] `set` (sorted, disjoint) covers.
double covered(const Intervals& set, double t0, double t1);

// How a non-blocking MPI call's transfer is estimated: MPI without a progress
// thread moves the data of every call in flight whenever the rank is inside
// MPI for any call at all, on any communicator (issuing one, testing or
// waiting for one, or a blocking call, such as a scalar all-reduce made while
// gradient buckets are in flight). Each such interval is shared by the calls
// in flight then, in proportion to their bytes, so the summed transfer of a
// step's calls is the rank's time inside MPI while they were in flight, each
// interval counted once, and calls of different sizes keep their shares.
//
// A rank alone inside MPI moves little of a collective, though: its peers
// must be inside MPI too. The intervals and shares are therefore kept, and
// once the run is over the report counts a collective's share of an interval
// only while every other member of its group was inside MPI as well
// (share_progress_with_group in src/train/run_report). One per rank, in its
// CommLog, which every profiled communicator of the rank shares.
struct HostProgress {
  struct InFlight {
    std::size_t record;
    double bytes;  // at least 1: an empty call still takes its share
    double busy;   // seconds given to it so far
  };
  // `share` of the interval [t0, t1] inside MPI went to `record`.
  struct Piece {
    std::size_t record;
    double t0, t1, share;
  };
  std::vector<InFlight> in_flight;
  Intervals inside;         // every interval inside MPI (log times), in order
  std::vector<Piece> pieces;  // in order of t0
  // [t0, t1] (log times) inside MPI, shared among the calls in flight.
  void spent(double t0, double t1);
  // The seconds given to `record`, which leaves the set.
  double complete(std::size_t record);
};

class CommLog {
 public:
  explicit CommLog(double origin) : origin_(origin) {}
  // A log whose calls take no time (the meta device: a dry run, an
  // estimate): the profiled layer records what each call moves but reads
  // no clock and keeps no account of progress, which would be most of
  // what a meta call costs.
  void untimed() { timed_ = false; }
  bool timed() const { return timed_; }
  void set_step(int step) { step_ = step; }
  int step() const { return step_; }
  // Optional, before the first step: room for n records, with its pages
  // touched now. Otherwise the log's growth (copies, and a page fault per new
  // page) is most of what a record costs (bench_comm --reserve shows it).
  void reserve(std::size_t n) {
    const std::size_t size = records_.size();
    if (n <= size) return;
    records_.resize(n);
    records_.resize(size);
  }
  double origin() const { return origin_; }
  // Appends a record and returns its index (non-blocking calls fill in end and wait later).
  std::size_t add(CommRecord r) {
    records_.push_back(std::move(r));
    return records_.size() - 1;
  }
  CommRecord& at(std::size_t i) { return records_[i]; }
  // Drops the records kept so far and their account of progress, keeping
  // their room: a run's records once they are written to its report, at a
  // step boundary. No call may be in flight (its record's index would
  // outlive the record).
  void clear();
  const std::vector<CommRecord>& records() const { return records_; }
  // The rank's non-blocking MPI calls in flight and the time inside MPI given
  // to each (see HostProgress).
  HostProgress& progress() { return progress_; }

 private:
  double origin_;
  bool timed_ = true;
  int step_ = 0;
  std::vector<CommRecord> records_;
  HostProgress progress_;
};

}  // namespace strata::comm
