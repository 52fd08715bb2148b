#include "src/sim/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <string_view>
#include <tuple>

#include <fmt/format.h>

#include "kernels/foundation/error.hpp"

namespace strata::sim {

using prof::TraceEvent;

double kernel_time(const Machine& m, const TraceEvent& e, core::Precision p) {
  if (e.host) {  // offloaded work on the host's cores: memory-bound arithmetic
    const double vector = m.host_vector_flops > 0 ? (e.other_flops + e.matmul_flops) / m.host_vector_flops : 0;
    const double memory = m.host_memory_bandwidth > 0 ? e.bytes / m.host_memory_bandwidth : 0;
    const auto f = m.gpu ? m.kernel_factors.end() : m.kernel_factors.find(e.name);
    return std::max(vector, memory) * (f != m.kernel_factors.end() ? f->second : 1.0);
  }
  double products = 0;
  if (e.matmul_flops > 0) {
    double eff = m.matmul_efficiency;
    if (m.matmul_half_dim > 0 && e.m > 0) {
      const double d = std::min({e.m, e.n, e.k});
      eff *= d / (d + m.matmul_half_dim);
    }
    products = e.matmul_flops / (m.peak(p) * eff);
  }
  const double vector = m.vector_flops > 0 ? e.other_flops / m.vector_flops : 0;
  const double memory = m.memory_bandwidth > 0 ? e.bytes / m.memory_bandwidth : 0;
  const auto f = m.kernel_factors.find(e.name);
  return m.launch_latency + std::max(products + vector, memory) * (f != m.kernel_factors.end() ? f->second : 1.0);
}

namespace {

// Ring steps of an op over n ranks: the latency terms of its time.
double ring_steps(const std::string& op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1);
  if (op == "send" || op == "recv") return 1;
  if (op == "barrier") return 2.0 * std::ceil(std::log2(double(n)));
  return n - 1;
}

}  // namespace

GroupShape group_shape(const Machine& m, const std::vector<int>& group) {
  GroupShape g;
  g.n = int(group.size());
  if (g.n == 0) return g;
  std::map<int, int> per_node;
  for (int r : group) ++per_node[r / m.devices_per_node];
  g.across = per_node.size() > 1;
  for (const auto& [node, k] : per_node) g.most = std::max(g.most, k);
  g.first = *std::min_element(group.begin(), group.end());
  g.last = *std::max_element(group.begin(), group.end());
  return g;
}

double comm_time(const Machine& m, const std::string& op, const std::vector<int>& group, double bytes,
                 bool nonblocking) {
  return group.size() <= 1 ? 0.0 : comm_time(m, op, group_shape(m, group), bytes, nonblocking);
}

double comm_time(const Machine& m, const std::string& op, const GroupShape& g, double bytes, bool nonblocking) {
  const int n = g.n;
  if (n <= 1) return 0;
  const bool across = g.across;
  const int most = g.most;
  const std::string level = across ? "cluster" : "node";
  // Point-to-point and collectives share the nccl-tests convention: bytes
  // times the op's bus factor over the bus bandwidth.
  const double factor = (op == "send" || op == "recv") ? 1.0 : comm::busbw_factor(op, n);
  // The form's own fit, else the other form's; all_to_allv (MoE's exchange
  // of routed rows) as all_to_all, its even-sized form.
  const std::string fit_op = op == "all_to_allv" ? "all_to_all" : op;
  const CommFit* fit = nullptr;
  for (const CommFit& f : m.fits)
    if (f.level == level && f.op == fit_op && f.group_size == n && (fit == nullptr || f.nonblocking == nonblocking))
      fit = &f;
  if (fit != nullptr) {
    const auto& xs = fit->bytes;
    if (xs.size() >= 2 && bytes >= xs.front() && bytes <= xs.back()) {
      const std::size_t j = std::max<std::size_t>(1, std::size_t(std::lower_bound(xs.begin(), xs.end(), bytes) - xs.begin()));
      const double w = (bytes - xs[j - 1]) / (xs[j] - xs[j - 1]);
      return fit->seconds[j - 1] + w * (fit->seconds[j] - fit->seconds[j - 1]);
    }
    return fit->latency + bytes * factor / fit->bandwidth;
  }
  if (across && m.cluster.bandwidth <= 0)
    core::input_error("machine {} ({}) describes one node of {} device(s) and no [network.cluster]: a group of ranks "
                      "{}..{} spans nodes",
                      m.name, m.path, m.devices_per_node, g.first, g.last);
  // Across nodes each device owns an equal share of its node's NICs; a
  // group's ring through a node uses the shares of its members there.
  const double bw = across ? std::min(m.node.bandwidth, m.cluster.bandwidth * most / m.devices_per_node)
                           : m.node.bandwidth;
  const double latency = across ? m.cluster.latency : m.node.latency;
  return ring_steps(op, n) * latency + bytes * factor / bw;
}

double transfer_time(const Machine& m, const std::string& axis, double bytes) {
  if (axis == "nvme") {
    if (m.nvme_bandwidth <= 0)
      core::input_error("machine {} ({}) has no NVMe (device.nvme_gbs = 0): it cannot time offload to NVMe", m.name,
                        m.path);
    return bytes / m.nvme_bandwidth;
  }
  return bytes / (m.host_link_bandwidth > 0 ? m.host_link_bandwidth : m.memory_bandwidth / 2);  // a copy reads and writes
}

namespace {


// Offload's copies and file I/O: a rank's own channels, not a mesh group.
bool offload_axis(const std::string& axis) { return axis == "host" || axis == "nvme"; }

// A non-blocking call in flight.
struct Pending {
  double issue = 0;
  double remaining = 0;    // seconds of transfer left at the full rate (channel calls)
  double done = -1;        // when it completed, once known
  std::size_t record = 0;  // in the stage's comms
  bool recv = false;       // an irecv: completes when its message arrives
  bool fixed = false;      // its completion is `done`, set at issue (sends, calls spanning stages)
};

// An axis's calls in flight, in order: the head progresses at `share` of
// the full rate while the rank computes and at the full rate while it is
// blocked (inside the communication library, which then drives it).
struct Channel {
  std::deque<int> queue;  // trace indices of its pending calls
  double last = 0;        // progress is accounted up to here
  double share = 1;
};

struct Stage {
  const prof::Trace* trace = nullptr;
  std::size_t next = 0;
  double clock = 0;
  std::vector<std::pair<const TraceEvent*, double>> open;  // spans begun
  std::map<std::string, Channel> channels;                 // per axis (and per pipeline peer)
  std::map<std::string, int> crossing_calls;               // per axis spanning stages: calls done
  std::map<int, Pending> pending;                          // non-blocking calls by trace index
  std::map<std::string, std::vector<int>> groups;          // per axis: world ranks
  std::map<std::string, GroupShape> shapes;                // per axis: what a call's time needs of it
  std::map<std::string, std::vector<int>> stages;          // per axis: the stages its group spans
  StageTiming out;

  // Moves the channel's calls on to `until` at `rate`; with `target`, stops
  // once that call is done (until may be infinite then).
  void progress(Channel& ch, double until, double rate, int target = -1) {
    while (!ch.queue.empty()) {
      Pending& h = pending[ch.queue.front()];
      const double begin = std::max(ch.last, h.issue);
      if (begin >= until) return;
      const double can = (until - begin) * rate;
      if (can < h.remaining) {
        h.remaining -= can;
        ch.last = until;
        return;
      }
      h.done = begin + (h.remaining > 0 ? h.remaining / rate : 0.0);  // a free call at a share of 0 is done at once
      h.remaining = 0;
      ch.last = h.done;
      comm::CommRecord& r = out.comms[h.record];
      r.end = std::max(r.start, h.done);
      const int id = ch.queue.front();
      ch.queue.pop_front();
      if (id == target) return;
    }
    if (until > ch.last && until < std::numeric_limits<double>::infinity()) ch.last = until;
  }
  // The rank computes until `t`: its channels progress at their shares.
  void compute_until(double t) {
    for (auto& [axis, ch] : channels) progress(ch, t, ch.share);
    clock = t;
  }
  // Until when a call of the rank moves beside its compute, if it computes
  // from now on (nothing else is issued meanwhile): a network axis's queue
  // draining at its share, a send on its link, or a non-blocking call
  // spanning stages (its end known when it was issued). `clock` when none
  // does; a queue at a share of 0 does not move.
  double moving_until() {
    double until = clock;
    for (const auto& [id, w] : pending)
      if (w.fixed && w.done > clock && !offload_axis(out.comms[w.record].axis)) until = std::max(until, w.done);
    for (auto& [axis, ch] : channels) {
      if (offload_axis(axis)) continue;  // copy engines and threads of their own
      if (!ch.queue.empty() && ch.share > 0) {
        double t = std::max(ch.last, clock);
        for (int id : ch.queue) t = std::max(t, pending[id].issue) + pending[id].remaining / ch.share;
        until = std::max(until, t);
      } else if (ch.queue.empty()) {
        until = std::max(until, ch.last);  // a link's sends: busy until its last leaves
      }
    }
    return until;
  }
  // A kernel of `t` seconds alone, `slowdown` times slower while a call
  // moves beside it.
  void run_kernel(double t, double slowdown) {
    const double busy = slowdown > 1 ? moving_until() - clock : 0;
    const double d = busy <= 0 ? t : busy >= t * slowdown ? t * slowdown : busy + (t - busy / slowdown);
    compute_until(clock + d);
    out.compute += d;
    out.slowed += d - t;
  }
  // The rank is blocked until `t` (counted as exposed communication).
  void block_until(double t) {
    if (t <= clock) return;
    for (auto& [axis, ch] : channels) progress(ch, t, 1.0);
    out.comm_wait += t - clock;
    clock = t;
  }
  // When the channel's calls up to `target` (all, with -1) are done if the
  // rank blocks now.
  double drain(Channel& ch, int target = -1) {
    progress(ch, clock, ch.share);
    double t = clock;
    while (!ch.queue.empty()) {
      const int id = ch.queue.front();
      progress(ch, std::numeric_limits<double>::infinity(), 1.0, id);
      t = std::max(t, pending[id].done);
      if (id == target) break;
    }
    return t;
  }
};

struct Meeting {
  std::vector<double> arrive;
  int arrived = 0;
  double end = -1;
};

struct Message {
  double sent = 0, arrival = 0;
};

}  // namespace

StepSimulation simulate_step(const mesh::Layout& l, const std::vector<const prof::Trace*>& traces, const Machine& m,
                             core::Precision precision, const SimOptions& options) {
  // The pipeline's stages: one trace each, that of the stage's first rank
  // (or the one the options name).
  const int p = l.size("pp");
  STRATA_CHECK(int(traces.size()) == p, "simulate_step: {} traces for {} stages", traces.size(), p);
  STRATA_CHECK(options.ranks.empty() || int(options.ranks.size()) == p, "simulate_step: {} ranks for {} stages",
               options.ranks.size(), p);
  std::vector<Stage> st(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s) {
    st[s].trace = traces[s];
    st[s].out.rank = options.ranks.empty() ? mesh::rank_at(l, {{"pp", s}}) : options.ranks[std::size_t(s)];
    STRATA_CHECK(mesh::coord(l, st[s].out.rank, "pp") == s, "simulate_step: rank {} is not on stage {}",
                 st[s].out.rank, s);
  }
  auto free = [&](const std::string& axis) {
    for (const std::string& a : options.free_axes)
      if (a == "*" || a == axis) return true;
    return false;
  };
  // A call's time at the full rate: none on a free axis.
  auto call_time = [&](const prof::TraceComm& c, const GroupShape& members) {
    if (free(c.axis)) return 0.0;
    if (offload_axis(c.axis)) return transfer_time(m, c.axis, double(c.bytes));
    return comm_time(m, c.op, members, double(c.bytes), c.nonblocking);
  };
  auto group = [&](Stage& s, const std::string& axis) -> const std::vector<int>& {
    auto it = s.groups.find(axis);
    if (it == s.groups.end()) it = s.groups.emplace(axis, mesh::group_ranks(l, axis, s.out.rank)).first;
    return it->second;
  };
  // Once per stage and axis: a group of 10^5 ranks costs its map of nodes
  // once, not at every call.
  auto shape = [&](Stage& s, const std::string& axis) -> const GroupShape& {
    auto it = s.shapes.find(axis);
    if (it == s.shapes.end()) it = s.shapes.emplace(axis, group_shape(m, group(s, axis))).first;
    return it->second;
  };
  auto channel = [&](Stage& s, const std::string& axis) -> Channel& {
    auto it = s.channels.find(axis);
    if (it == s.channels.end()) {
      it = s.channels.emplace(axis, Channel{}).first;
      it->second.last = s.clock;
      // Offload's copies and file I/O run on threads of their own.
      it->second.share = offload_axis(axis) ? 1.0 : m.overlap;
    }
    return it->second;
  };
  // The stages whose ranks meet in a call on `axis` from stage s: more
  // than s's own when the group spans stages (pp, emb, world).
  auto stages_of = [&](Stage& s, const std::string& axis) -> const std::vector<int>& {
    auto it = s.stages.find(axis);
    if (it != s.stages.end()) return it->second;
    std::vector<int> out;
    for (int r : group(s, axis)) out.push_back(mesh::coord(l, r, "pp"));
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return s.stages.emplace(axis, std::move(out)).first->second;
  };
  std::map<std::pair<std::string, int>, Meeting> meetings;
  std::map<std::tuple<int, int, int>, std::deque<Message>> mail;  // (from, to, tag)

  // `transfer`: the call's modelled transfer time at the full rate, or -1
  // for its span less the wait for its peer (receives). Kept in
  // transfer_end until the step is done, when the transfer is placed to end
  // with the call, as a run estimates a non-blocking MPI call's.
  auto record = [&](Stage& s, const prof::TraceComm& c, double start, double end, double transfer) {
    s.out.comms.push_back(
        comm::CommRecord{0, c.op, c.axis, c.group_size, c.bytes, c.nonblocking, start, end, 0.0, 0.0, 0.0, transfer, c.peer, c.tag});
    return s.out.comms.size() - 1;
  };
  // A blocking call's record: blocked from `from` to the rank's clock now.
  auto blocked = [&](Stage& s, std::size_t i, double from, double peer_wait = 0) {
    comm::CommRecord& r = s.out.comms[i];
    r.end = std::max(r.end, s.clock);
    r.wait += s.clock - from;
    r.peer_wait += peer_wait;
  };
  // Point-to-point messages: between stages where the peer is on another
  // (the pipeline's); else between ranks of one stage (context
  // parallelism's ring), which all do the same, so a stage's own send stands
  // for the one its peer sends it at the same moment: kept in the stage's
  // mirror box (from -1 - stage).
  auto peer_stage = [&](Stage& s, const prof::TraceComm& c) {
    return mesh::coord(l, group(s, c.axis)[std::size_t(c.peer)], "pp");
  };
  auto sender = [&](int me, const prof::TraceComm& c) {
    const int other = peer_stage(st[std::size_t(me)], c);
    return other != me ? other : -1 - me;
  };
  // A receive of `c` on stage `me`: false while its message has not been sent.
  auto receive = [&](int me, const prof::TraceComm& c, double* arrival, double* sent) {
    auto& q = mail[{sender(me, c), me, c.tag}];
    if (q.empty()) return false;
    *arrival = q.front().arrival;
    *sent = q.front().sent;
    q.pop_front();
    return true;
  };

  for (bool moved = true; moved;) {
    moved = false;
    for (int si = 0; si < p; ++si) {
      Stage& s = st[si];
      const auto& events = s.trace->events;
      for (; s.next < events.size(); ++s.next, moved = true) {
        const TraceEvent& e = events[s.next];
        if (e.kind == TraceEvent::Kind::kernel) {
          // Contention in proportion to the rate communication moves beside the
          // kernel (so to the bytes it moves meanwhile): compute_slowdown at
          // the full rate, none where nothing moves.
          const double slowdown = e.host ? 1.0 : 1 + (m.compute_slowdown - 1) * m.overlap;  // host: not the device
          s.run_kernel(kernel_time(m, e, precision), slowdown);
        } else if (e.kind == TraceEvent::Kind::span_begin) {
          s.open.push_back({&e, s.clock});
        } else if (e.kind == TraceEvent::Kind::span_end) {
          STRATA_CHECK(!s.open.empty(), "simulate_step: a span ends that never began");
          s.out.spans.push_back(prof::Span{0, e.micro_batch, e.chunk, e.layer, e.phase, s.open.back().second, s.clock});
          s.open.pop_back();
        } else if (e.kind == TraceEvent::Kind::comm) {
          const prof::TraceComm& c = s.trace->comms[std::size_t(e.comm)];
          const double now = s.clock;
          if (c.op == "send") {
            // Leaves when the link to the peer is free; arrives after its transfer.
            const int to = peer_stage(s, c);
            const bool ring = to == si;
            const std::vector<int> pair = {s.out.rank, group(s, c.axis)[std::size_t(c.peer)]};
            Channel& link = channel(s, c.axis + ">" + std::to_string(c.peer));
            const double start = std::max(now, link.last);
            const double t = call_time(c, group_shape(m, pair));
            link.last = start + t;
            mail[{ring ? -1 - si : si, ring ? si : to, c.tag}].push_back({start, start + t});
            const std::size_t i = record(s, c, now, start + t, t);
            if (c.nonblocking) {
              Pending& w = s.pending[e.comm];
              w.issue = now, w.done = start + t, w.record = i, w.fixed = true;
            } else {
              s.block_until(start + t);
              blocked(s, i, now);
            }
          } else if (c.op == "recv") {
            if (c.nonblocking) {
              Pending& w = s.pending[e.comm];
              w.issue = now, w.record = record(s, c, now, now, -1), w.recv = true;
              continue;
            }
            double arrival = 0, sent = 0;
            if (!receive(si, c, &arrival, &sent)) break;
            const std::size_t i = record(s, c, now, now, -1);
            s.block_until(arrival);
            blocked(s, i, now, std::max(0.0, std::min(s.clock, sent) - now));
          } else if (!offload_axis(c.axis) && stages_of(s, c.axis).size() > 1) {
            const std::vector<int>& who = stages_of(s, c.axis);
            Meeting& mt = meetings[{c.axis, s.crossing_calls[c.axis]}];
            if (mt.arrive.empty()) mt.arrive.assign(std::size_t(p), -1);
            if (mt.arrive[si] < 0) mt.arrive[si] = s.clock, ++mt.arrived;
            if (mt.arrived < int(who.size())) break;  // the others have not reached it
            const double t = call_time(c, shape(s, c.axis));
            if (mt.end < 0) {
              double start = 0;
              for (int w : who) start = std::max(start, mt.arrive[w]);
              mt.end = start + t;
            }
            ++s.crossing_calls[c.axis];
            const std::size_t i = record(s, c, now, mt.end, t);
            if (c.nonblocking) {
              Pending& w = s.pending[e.comm];
              w.issue = now, w.done = mt.end, w.record = i, w.fixed = true;
            } else {
              s.block_until(mt.end);
              blocked(s, i, now);
            }
          } else {
            // Inside the stage: after the axis's calls in flight, in order.
            // (Offload's channels are the rank's own: no group.)
            const double t = call_time(c, offload_axis(c.axis) ? GroupShape{} : shape(s, c.axis));
            Channel& ch = channel(s, c.axis);
            if (c.nonblocking) {
              Pending& w = s.pending[e.comm];
              w.issue = now, w.remaining = t, w.record = record(s, c, now, now, t);
              ch.queue.push_back(e.comm);
            } else {
              const std::size_t i = record(s, c, now, now, t);
              s.block_until(s.drain(ch));
              s.block_until(s.clock + t);
              ch.last = std::max(ch.last, s.clock);
              blocked(s, i, now);
            }
          }
        } else {  // wait
          auto it = s.pending.find(e.comm);
          STRATA_CHECK(it != s.pending.end(), "simulate_step: a wait for a call never issued");
          Pending& w = it->second;
          const double now = s.clock;
          double done = 0;
          if (w.recv) {
            double arrival = 0, sent = 0;
            if (!receive(si, s.trace->comms[std::size_t(e.comm)], &arrival, &sent)) break;
            done = arrival;
          } else if (w.fixed || w.done >= 0) {
            done = w.done;
          } else {
            done = s.drain(channel(s, s.trace->comms[std::size_t(e.comm)].axis), e.comm);
          }
          s.block_until(std::max(now, done));
          comm::CommRecord& r = s.out.comms[w.record];
          r.end = std::max({r.end, r.start, done});
          r.wait += s.clock - now;
          s.pending.erase(it);
        }
      }
    }
  }
  StepSimulation sim;
  std::string stuck;
  for (int si = 0; si < p; ++si) {
    Stage& s = st[si];
    if (s.next < s.trace->events.size()) {
      const TraceEvent& e = s.trace->events[s.next];
      const prof::TraceComm& c = s.trace->comms[std::size_t(std::max(e.comm, 0))];
      stuck += fmt::format("{}stage {} waits in {} on {} (peer {})", stuck.empty() ? "" : "; ", si, c.op, c.axis, c.peer);
    }
    s.out.end = s.clock;
    sim.step_time = std::max(sim.step_time, s.clock);
  }
  if (!stuck.empty()) core::runtime_error("the simulated step cannot finish: {}", stuck);
  for (Stage& s : st) {
    for (comm::CommRecord& r : s.out.comms) {
      const double d = r.transfer_end >= 0 ? r.transfer_end : r.end - r.start - r.peer_wait;
      r.transfer_end = r.end;
      r.transfer_start = std::max(r.start, r.end - d);
    }
    sim.stages.push_back(std::move(s.out));
  }
  return sim;
}

}  // namespace strata::sim
