#include "src/train/plan.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "kernels/foundation/error.hpp"
#include "src/deck/deck.hpp"
#include "src/report/h5file.hpp"
#include "src/report/points.hpp"
#include "strategies/pp/schedule.hpp"
#include "src/sim/machine.hpp"
#include "src/train/run.hpp"
#include "src/train/simulate.hpp"

namespace strata::train {

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

struct Candidate {
  std::string label;      // "dp 2 tp 1 pp 2 zero 1 1f1b mb 4": for people
  std::string overrides;  // space-separated section.key=value
  int world = 0;
  std::string status;     // "complete" (predicted, fits) or "skipped" (see reason)
  std::string reason;
  double tokens_per_s = 0, mfu = 0, step_time = 0, peak_bytes = 0, bubble = 0, exposed_comm = 0;
};

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

}  // namespace

int plan_deck(const std::string& deck_path, const std::string& text, const std::vector<std::string>& sets,
              const PlanOptions& o) {
  if (o.world < 1) core::input_error("--world {}: the devices to plan for, at least 1", o.world);
  if (o.top < 1) core::input_error("--top {}: at least 1 row", o.top);
  const sim::Machine machine = sim::load_machine(o.machine);
  const deck::Deck base = deck::parse_deck(deck_path, text, sets);
  const plan::Plan& b = base.config;
  const double limit = o.memory_limit > 0 ? double(o.memory_limit) : machine.memory;
  const int N = o.world;
  const bool moe = b.model.moe_experts > 0;

  std::vector<Candidate> all;
  int layouts = 0;
  for (int tp : divisors(N)) {
    if (tp > machine.devices_per_node || b.model.heads % tp != 0) continue;  // tp stays inside a node
    for (int pp : divisors(N / tp)) {
      if (pp > b.model.layers) continue;
      // Context parallelism splits each sequence into 2 cp chunks.
      for (int cp : divisors(N / tp / pp)) {
      if (cp > 1 && (moe || b.model.seq_len % (2 * cp) != 0)) continue;
      const int dp = N / tp / pp / cp;
      if (b.data.global_batch % dp != 0) continue;
      for (int ep : moe ? divisors(dp) : std::vector<int>{1}) {
        if (moe && b.model.moe_experts % ep != 0) continue;
        struct Sched {
          const char* name;
          int v;
        };
        // Every registered schedule (two chunks per rank where its row runs
        // virtual stages); without a pipeline, the one that needs no shape.
        std::vector<Sched> scheds = {{"1f1b", 1}};
        if (pp > 1) {
          scheds.clear();
          for (const auto& row : strategies::pp::schedules()) scheds.push_back({row.name, row.virtual_stages ? 2 : 1});
        }
        // ZeRO over the whole dp group, or (hybrid sharding) over the dp
        // ranks of one node, replicated across nodes.
        const int node_dp = std::max(1, machine.devices_per_node / tp);
        const bool hybrid = !moe && cp == 1 && node_dp > 1 && node_dp < dp && dp % node_dp == 0;
        for (int zero = 0; zero <= 3; ++zero)
          for (int shard : zero > 0 && hybrid ? std::vector<int>{0, node_dp} : std::vector<int>{0})
          for (const Sched& sc : scheds)
            for (int mb : {1, 2, 4, 8}) {
              if ((b.data.global_batch / dp) % mb != 0) continue;
              for (bool sp : tp > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
                ++layouts;
                std::vector<std::string> layout = {
                    fmt::format("parallel.dp={}", dp), fmt::format("parallel.tp={}", tp),
                    fmt::format("parallel.pp={}", pp), fmt::format("parallel.zero={}", zero),
                    fmt::format("parallel.schedule=\"{}\"", sc.name), fmt::format("parallel.virtual_stages={}", sc.v),
                    fmt::format("data.micro_batch={}", mb), fmt::format("parallel.sequence_parallel={}", sp),
                    fmt::format("parallel.cp={}", cp)};
                if (moe) layout.push_back(fmt::format("parallel.ep={}", ep));
                if (shard > 0) layout.push_back(fmt::format("parallel.dp_shard={}", shard));
                // The least recomputation and offload that fits.
                bool invalid = false;  // the deck's checks refuse it: whatever the recomputation or offload
                for (const char* offload : {"none", "host"}) {
                  if (invalid) break;
                  bool fits = false;
                  for (const char* rec : {"none", "selective", "full"}) {
                    std::vector<std::string> over = layout;
                    over.push_back(fmt::format("model.recompute=\"{}\"", rec));
                    over.push_back(fmt::format("parallel.offload=\"{}\"", offload));
                    Candidate c;
                    c.overrides = join(over);
                    c.label = fmt::format("dp {}{} tp {}{} pp {} {}{} zero {}{} mb {}{}{}", dp,
                                          cp > 1 ? fmt::format(" cp {}", cp) : "", tp, sp ? " sp" : "", pp,
                                          pp > 1 ? sc.name : "", sc.v > 1 ? fmt::format(" v {}", sc.v) : "", zero,
                                          shard > 0 ? fmt::format(" shard {}", shard) : "", mb,
                                          moe ? fmt::format(" ep {}", ep) : "",
                                          fmt::format("{}{}", std::string(rec) == "none" ? "" : fmt::format(" recompute {}", rec),
                                                      std::string(offload) == "none" ? "" : " offload host"));
                    c.world = N;
                    std::vector<std::string> all_sets = sets;
                    all_sets.insert(all_sets.end(), over.begin(), over.end());
                    try {
                      const deck::Deck d = deck::parse_deck(deck_path, text, all_sets);
                      const Prediction pr = predict(d.config, machine);
                      double peak = 0;
                      for (const RankClass& k : pr.estimate.classes)
                        peak = std::max(peak, double(k.memory[core::Pool::device].total_peak));
                      c.peak_bytes = peak;
                      c.tokens_per_s = pr.tokens_per_s;
                      c.mfu = pr.mfu;
                      c.step_time = pr.step.step_time;
                      for (const Bubble& b : pr.bubbles) c.bubble = std::max(c.bubble, b.idle_over_step);
                      for (const auto& s : pr.step.stages) c.exposed_comm = std::max(c.exposed_comm, s.comm_wait);
                      fits = peak <= limit;
                      c.status = fits ? "complete" : "skipped";
                      if (!fits)
                        c.reason = fmt::format("does not fit: device peak {} > {}", core::format_bytes(peak),
                                               core::format_bytes(limit));
                    } catch (const core::Error& e) {
                      // Invalid (the deck's checks), or not simulable: skipped with its reason,
                      // whatever the recomputation.
                      c.status = "skipped";
                      c.reason = e.kind() == core::ErrorKind::input ? e.what() : fmt::format("cannot simulate: {}", e.what());
                      all.push_back(c);
                      invalid = true;
                      break;
                    }
                    all.push_back(c);
                    if (fits) break;
                  }
                  if (fits) break;
                }
              }
            }
      }
      }
    }
  }

  std::vector<std::size_t> ranked;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i].status == "complete") ranked.push_back(i);
  std::stable_sort(ranked.begin(), ranked.end(),
                   [&](std::size_t a, std::size_t c) { return all[a].tokens_per_s > all[c].tokens_per_s; });

  const std::string path = !o.output.empty() ? o.output : "results/" + b.run.name + "-plan.h5";
  {
    report::H5File f(MPI_COMM_SELF, path);
    f.set_attr("/", "schema", std::string("strata-plan"));
    f.set_attr("/", "schema_version", std::int64_t(1));
    f.set_attr("/", "sweep", b.run.name + " plan");
    f.set_attr("/", "deck_path", deck_path);
    f.set_attr("/", "command_line", o.command_line);
    f.set_attr("/", "start_time", iso_time_utc());
    f.set_attr("/", "machine", machine.name);
    f.set_attr("/", "machine_path", machine.path);
    f.set_attr("/", "world_size", std::int64_t(N));
    f.set_attr("/", "memory_limit", limit);
    f.set_attr("/", "axes", std::string("dp x cp x tp x pp = world; ep; zero; dp_shard (dp, or one node's dp ranks); schedule; "
                                        "micro_batch; sequence_parallel; "
                                        "the least recompute and offload that fits"));
    f.set_attr("/", "where", std::string(""));
    report::PointColumns what;
    what.point = "0-based candidate index";
    what.overrides = "the deck keys the candidate sets, space-separated";
    what.world = "devices";
    what.status = "complete (predicted and fits) or skipped (see reason)";
    what.reason = "why a candidate is skipped: invalid (the deck's error) or does not fit";
    what.report = "empty: a plan writes no report per candidate";
    what.tokens_per_s = "predicted throughput";
    what.mfu = "predicted model FLOP utilisation";
    what.step_time = "predicted step time";
    what.peak_bytes = "the most device bytes any rank holds at once (the estimate)";
    what.final_loss = "NaN: nothing is trained";
    report::Table t =
        report::points_table("one row per candidate layout: its overrides, status and predicted figures", what);
    t.col_f64("bubble", "1", "the largest pipeline stage's idle share of the step")
        .col_f64("exposed_comm", "s", "the most time a simulated rank spends blocked in communication");
    for (std::size_t i = 0; i < all.size(); ++i) {
      const Candidate& c = all[i];
      t.add_row({std::int64_t(i), c.overrides.substr(0, 255), std::int64_t(c.world), c.status, c.reason.substr(0, 511),
                 std::string(), c.tokens_per_s, c.mfu, c.step_time, c.peak_bytes, std::nan(""), c.bubble,
                 c.exposed_comm});
    }
    f.write_table(t);
    f.set_attr("/", "status", "complete");
    f.publish();
  }

  fmt::print("strata plan | {} | machine {} | {} device(s), at most {} each | {} layout(s), {} candidate(s) "
             "predicted or refused, {} fit\n",
             deck_path, machine.name, N, core::format_bytes(limit), layouts, all.size(), ranked.size());
  fmt::print("  {:>4} {:>12} {:>6} {:>9} {:>11} {:>7} {:>10}  {}\n", "rank", "tokens/s", "MFU%", "step_ms",
             "peak mem", "bubble", "exposed_s", "layout");
  for (std::size_t r = 0; r < ranked.size() && int(r) < o.top; ++r) {
    const Candidate& c = all[ranked[r]];
    fmt::print("  {:>4} {:>12.0f} {:>6.1f} {:>9.2f} {:>11} {:>7.3f} {:>10.4f}  {}\n", r + 1, c.tokens_per_s,
               100 * c.mfu, 1e3 * c.step_time, core::format_bytes(c.peak_bytes), c.bubble, c.exposed_comm,
               c.label);
  }
  if (ranked.empty()) fmt::print("no layout fits: see {} for why each was refused\n", path);
  fmt::print("report: {} (analysis/strata-report {} --plots DIR: throughput against memory)\n", path, path);
  return ranked.empty() ? 3 : 0;
}

}  // namespace strata::train
