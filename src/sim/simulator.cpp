#include "src/sim/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
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

double comm_time(const Machine& m, const std::string& op, const std::vector<int>& group, double bytes,
                 bool nonblocking) {
  const int n = int(group.size());
  if (n <= 1) return 0;
  std::map<int, int> per_node;
  for (int r : group) ++per_node[r / m.devices_per_node];
  const bool across = per_node.size() > 1;
  int most = 0;
  for (const auto& [node, k] : per_node) most = std::max(most, k);
  const std::string level = across ? "cluster" : "node";
  // Point-to-point and collectives share the nccl-tests convention: bytes
  // times the op's bus factor over the bus bandwidth.
  const double factor = (op == "send" || op == "recv") ? 1.0 : comm::busbw_factor(op, n);
  const CommFit* fit = nullptr;  // the form's own fit, else the other form's
  for (const CommFit& f : m.fits)
    if (f.level == level && f.op == op && f.group_size == n && (fit == nullptr || f.nonblocking == nonblocking))
      fit = &f;
  if (fit != nullptr) return fit->latency + bytes * factor / fit->bandwidth;
  if (across && m.cluster.bandwidth <= 0)
    core::input_error("machine {} ({}) describes one node of {} device(s) and no [network.cluster]: a group of ranks "
                      "{}..{} spans nodes",
                      m.name, m.path, m.devices_per_node, group.front(), group.back());
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

bool spans_stages(const std::string& axis) { return axis == "pp" || axis == "emb" || axis == "world"; }

struct Pending {
  double start = 0, duration = 0;
  std::size_t record = 0;  // in the stage's comms
  bool recv = false;       // an irecv: completes when its message arrives
};

struct Stage {
  const prof::Trace* trace = nullptr;
  std::size_t next = 0;
  double clock = 0;
  std::vector<std::pair<const TraceEvent*, double>> open;  // spans begun
  std::map<std::string, double> channel_free;              // per axis: when its last transfer ends
  std::map<std::string, int> crossing_calls;               // per axis spanning stages: calls done
  std::map<int, Pending> pending;                          // non-blocking calls by trace index
  std::map<std::string, std::vector<int>> groups;          // per axis: world ranks
  StageTiming out;
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
                             core::Precision precision) {
  const int p = l.pp;
  STRATA_CHECK(int(traces.size()) == p, "simulate_step: {} traces for {} stages", traces.size(), p);
  std::vector<Stage> st(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s) {
    st[s].trace = traces[s];
    st[s].out.rank = mesh::rank_of(l, {s, 0, 0});
  }
  auto group = [&](Stage& s, const std::string& axis) -> const std::vector<int>& {
    auto it = s.groups.find(axis);
    if (it == s.groups.end()) it = s.groups.emplace(axis, mesh::group_ranks(l, axis, s.out.rank)).first;
    return it->second;
  };
  // Which stages meet in a call spanning stages.
  auto members = [&](const std::string& axis) {
    std::vector<int> out;
    if (axis == "emb") {
      out = {l.emb_first, l.last_stage_rank()};
      if (out[0] == out[1]) out.pop_back();
    } else {
      for (int s = 0; s < p; ++s) out.push_back(s);
    }
    return out;
  };
  std::map<std::pair<std::string, int>, Meeting> meetings;
  std::map<std::tuple<int, int, int>, std::deque<Message>> mail;  // (from, to, tag)

  auto record = [&](Stage& s, const prof::TraceComm& c, double start, double end, double wait, double peer_wait = 0) {
    s.out.comms.push_back(comm::CommRecord{0, c.op, c.axis, c.group_size, c.bytes, c.nonblocking, start, end, wait,
                                           peer_wait});
    s.out.comm_wait += wait;
    return s.out.comms.size() - 1;
  };
  // A receive of `c` on stage `me`: false while its message has not been sent.
  auto receive = [&](int me, const prof::TraceComm& c, double* arrival, double* sent) {
    auto& q = mail[{c.peer, me, c.tag}];
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
          const double t = kernel_time(m, e, precision);
          s.clock += t;
          s.out.compute += t;
        } else if (e.kind == TraceEvent::Kind::span_begin) {
          s.open.push_back({&e, s.clock});
        } else if (e.kind == TraceEvent::Kind::span_end) {
          STRATA_CHECK(!s.open.empty(), "simulate_step: a span ends that never began");
          s.out.spans.push_back(prof::Span{0, e.micro_batch, e.chunk, e.layer, e.phase, s.open.back().second, s.clock});
          s.open.pop_back();
        } else if (e.kind == TraceEvent::Kind::comm) {
          const prof::TraceComm& c = s.trace->comms[std::size_t(e.comm)];
          if (c.op == "send") {
            // Leaves at once (the executor's isend); arrives after the transfer.
            const std::vector<int> pair = {s.out.rank, mesh::rank_of(l, {c.peer, 0, 0})};
            const double start = std::max(s.clock, s.channel_free[c.axis + ">" + std::to_string(c.peer)]);
            const double t = comm_time(m, "send", pair, double(c.bytes));
            s.channel_free[c.axis + ">" + std::to_string(c.peer)] = start + t;
            mail[{si, c.peer, c.tag}].push_back({start, start + t});
            if (c.nonblocking) {
              s.pending[e.comm] = {start, t, record(s, c, s.clock, start + t, 0)};
            } else {
              record(s, c, s.clock, start + t, start + t - s.clock);
              s.clock = start + t;
            }
          } else if (c.op == "recv") {
            if (c.nonblocking) {
              s.pending[e.comm] = {s.clock, 0, record(s, c, s.clock, s.clock, 0), true};
              continue;
            }
            double arrival = 0, sent = 0;
            if (!receive(si, c, &arrival, &sent)) break;
            const double end = std::max(s.clock, arrival);
            record(s, c, s.clock, end, end - s.clock, std::max(0.0, std::min(end, sent) - s.clock));
            s.clock = end;
          } else if (spans_stages(c.axis) && l.pp > 1) {
            const std::vector<int> who = members(c.axis);
            Meeting& mt = meetings[{c.axis, s.crossing_calls[c.axis]}];
            if (mt.arrive.empty()) mt.arrive.assign(std::size_t(p), -1);
            if (mt.arrive[si] < 0) mt.arrive[si] = s.clock, ++mt.arrived;
            if (mt.arrived < int(who.size())) break;  // the others have not reached it
            if (mt.end < 0) {
              double start = 0;
              for (int w : who) start = std::max(start, mt.arrive[w]);
              mt.end = start + comm_time(m, c.op, group(s, c.axis), double(c.bytes));
            }
            ++s.crossing_calls[c.axis];
            if (c.nonblocking) {
              s.pending[e.comm] = {mt.end, 0, record(s, c, s.clock, mt.end, 0)};
            } else {
              record(s, c, s.clock, mt.end, mt.end - s.clock);
              s.clock = mt.end;
            }
          } else {
            const bool offload = c.axis == "host" || c.axis == "nvme";
            const double t = offload ? transfer_time(m, c.axis, double(c.bytes))
                                     : comm_time(m, c.op, group(s, c.axis), double(c.bytes), c.nonblocking);
            double& free = s.channel_free[c.axis];
            const double start = std::max(s.clock, free);
            free = start + t;
            if (c.nonblocking) {
              s.pending[e.comm] = {start, t, record(s, c, s.clock, start + t, 0)};
            } else {
              record(s, c, s.clock, start + t, start + t - s.clock);
              s.clock = start + t;
            }
          }
        } else {  // wait
          auto it = s.pending.find(e.comm);
          STRATA_CHECK(it != s.pending.end(), "simulate_step: a wait for a call never issued");
          Pending& w = it->second;
          comm::CommRecord& r = s.out.comms[w.record];
          double done = 0;
          if (w.recv) {
            double arrival = 0, sent = 0;
            if (!receive(si, s.trace->comms[std::size_t(e.comm)], &arrival, &sent)) break;
            done = std::max(s.clock, arrival);
          } else {
            // What is left of the transfer once the rank stops to wait: it
            // progressed at the overlap share while the rank computed.
            // Offload's copies and file I/O run on threads of their own.
            const auto& axis = s.trace->comms[std::size_t(e.comm)].axis;
            const double share = (axis == "host" || axis == "nvme") ? 1.0 : m.overlap;
            const double progressed = share * std::max(0.0, s.clock - w.start);
            done = std::max(w.start + w.duration, s.clock + std::max(0.0, w.duration - progressed));
          }
          const double waited = std::max(0.0, done - s.clock);
          r.end = std::max(r.start, done);
          r.wait += waited;
          s.out.comm_wait += waited;
          s.clock += waited;
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
  for (Stage& s : st) sim.stages.push_back(std::move(s.out));
  return sim;
}

}  // namespace strata::sim
