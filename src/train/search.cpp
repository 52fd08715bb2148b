#include "src/train/search.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "kernels/foundation/error.hpp"
#include "src/deck/deck.hpp"
#include "src/report/h5file.hpp"
#include "src/report/points.hpp"
#include "strategies/registry.hpp"
#include "src/sim/machine.hpp"
#include "src/train/run.hpp"
#include "src/train/simulate.hpp"

namespace strata::train {

namespace {

struct Candidate {
  std::string label;      // "tp 1 pp 2 dp 2 zero 1 mb 4": for people
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

const plan::KeySpec& key_of(std::string_view full) {
  const auto dot = full.find('.');
  const plan::KeySpec* k = plan::find_key(full.substr(0, dot), full.substr(dot + 1));
  STRATA_CHECK(k != nullptr, "a search names the unknown key {}", full);
  return *k;
}

// A value as a label says it: a number or a name; a true flag by its label.
std::string said(const strategies::Search& s, const std::string& text) {
  if (text == s.unsaid) return "";
  if (key_of(s.key).type == plan::KeyType::boolean) return std::string(s.label);
  return s.label.empty() ? text : fmt::format("{} {}", s.label, text);
}

// The override that sets a search's key to `text`.
std::string override_of(const strategies::Search& s, const std::string& text) {
  return fmt::format("{}={}", s.key, plan::toml_literal(plan::value_of(key_of(s.key), text)));
}

// The micro-batch: the planner's own search (a global key, no row's).
std::vector<std::string> micro_batches(const strategies::Space&, const plan::Plan& p) {
  std::vector<std::string> out;
  for (int mb : {1, 2, 4, 8})
    if ((p.data.global_batch / p.parallel.dp) % mb == 0) out.push_back(std::to_string(mb));
  return out;
}
const strategies::Search kMicroBatch{90, "data.micro_batch", micro_batches, false, "mb"};

// A candidate's keys: the search, its value and the override it makes.
struct Choice {
  const strategies::Search* search;
  std::string value;
};

}  // namespace

int search_layouts(const std::string& deck_path, const std::string& text, const std::vector<std::string>& sets,
                   const SearchOptions& o) {
  if (o.world < 1) core::input_error("--world {}: the devices to plan for, at least 1", o.world);
  if (o.top < 1) core::input_error("--top {}: at least 1 row", o.top);
  const sim::Machine machine = sim::load_machine(o.machine);
  const deck::Deck base = deck::parse_deck(deck_path, text, sets);
  const double limit = o.memory_limit > 0 ? double(o.memory_limit) : machine.memory;
  const strategies::Space space{o.world, machine.devices_per_node};

  // The layout's searches in order, then the fit searches (least cost first).
  std::vector<const strategies::Search*> layout, fit;
  for (const strategies::Search* s : strategies::searches()) (s->fit ? fit : layout).push_back(s);
  layout.insert(std::upper_bound(layout.begin(), layout.end(), &kMicroBatch,
                                 [](const auto* a, const auto* b) { return a->order < b->order; }),
                &kMicroBatch);
  // Every searched key at a default plan's value until its search sets it:
  // a dim not yet chosen holds one rank.
  plan::Plan start = base.config;
  for (const auto* s : layout) key_of(s->key).set(start, key_of(s->key).get(plan::Plan{}));
  for (const auto* s : fit) key_of(s->key).set(start, key_of(s->key).get(plan::Plan{}));

  std::vector<Candidate> all;
  int layouts = 0;
  // A layout: the least recomputation and offload that fits, or its refusal.
  auto judge = [&](const plan::Plan& chosen, const std::vector<Choice>& choices) {
    ++layouts;
    std::vector<std::string> over, label;
    for (const Choice& c : choices) {
      over.push_back(override_of(*c.search, c.value));
      if (std::string l = said(*c.search, c.value); !l.empty()) label.push_back(l);
    }
    std::vector<std::vector<std::string>> values;
    for (const auto* s : fit) {
      values.push_back(s->values(space, chosen));
      STRATA_CHECK(!values.back().empty(), "the search of {} offers no value", s->key);
    }
    std::vector<std::size_t> at(fit.size(), 0);
    for (;;) {
      std::vector<std::string> more = over, named = label;
      for (std::size_t i = 0; i < fit.size(); ++i) {
        const std::string& v = values[i][at[i]];
        more.push_back(override_of(*fit[i], v));
        if (std::string l = said(*fit[i], v); !l.empty()) named.push_back(l);
      }
      Candidate c;
      c.overrides = join(more);
      c.label = join(named);
      c.world = o.world;
      std::vector<std::string> all_sets = sets;
      all_sets.insert(all_sets.end(), more.begin(), more.end());
      bool fits = false;
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
        for (const auto& st : pr.step.stages) c.exposed_comm = std::max(c.exposed_comm, st.comm_wait);
        fits = peak <= limit;
        c.status = fits ? "complete" : "skipped";
        if (!fits)
          c.reason = fmt::format("does not fit: device peak {} > {}", core::format_bytes(peak), core::format_bytes(limit));
      } catch (const core::Error& e) {
        // Refused by the deck's checks (or not simulable): skipped with its
        // reason, whatever the recomputation and offload.
        c.status = "skipped";
        c.reason = e.kind() == core::ErrorKind::input ? e.what() : fmt::format("cannot simulate: {}", e.what());
        all.push_back(c);
        return;
      }
      all.push_back(c);
      if (fits) return;
      // The next combination, the last fit search fastest.
      std::size_t i = fit.size();
      while (i > 0 && ++at[i - 1] == values[i - 1].size()) at[--i] = 0;
      if (i == 0) return;
    }
  };
  std::vector<Choice> choices;
  auto choose = [&](auto& self, std::size_t i, const plan::Plan& so_far) -> void {
    if (i == layout.size()) return judge(so_far, choices);
    for (const std::string& v : layout[i]->values(space, so_far)) {
      plan::Plan next = so_far;
      key_of(layout[i]->key).set(next, plan::value_of(key_of(layout[i]->key), v));
      choices.push_back({layout[i], v});
      self(self, i + 1, next);
      choices.pop_back();
    }
  };
  choose(choose, 0, start);

  std::vector<std::size_t> ranked;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i].status == "complete") ranked.push_back(i);
  std::stable_sort(ranked.begin(), ranked.end(),
                   [&](std::size_t a, std::size_t c) { return all[a].tokens_per_s > all[c].tokens_per_s; });

  const std::string path = !o.output.empty() ? o.output : "results/" + base.config.run.name + "-plan.h5";
  {
    report::H5File f(MPI_COMM_SELF, path);
    f.set_attr("/", "schema", std::string("strata-plan"));
    f.set_attr("/", "schema_version", std::int64_t(1));
    f.set_attr("/", "sweep", base.config.run.name + " plan");
    f.set_attr("/", "deck_path", deck_path);
    f.set_attr("/", "command_line", o.command_line);
    f.set_attr("/", "start_time", iso_time_utc());
    f.set_attr("/", "machine", machine.name);
    f.set_attr("/", "machine_path", machine.path);
    f.set_attr("/", "world_size", std::int64_t(o.world));
    f.set_attr("/", "memory_limit", limit);
    std::vector<std::string> varied, least;
    for (const auto* x : layout) varied.push_back(std::string(x->key));
    for (const auto* x : fit) least.push_back(std::string(x->key));
    f.set_attr("/", "axes", fmt::format("the rows' searches: {}; the least of {} that fits", join(varied), join(least)));
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
      STRATA_CHECK(c.overrides.size() < std::size_t(report::kOverridesWidth), "a candidate's overrides exceed {} bytes: {}",
                   report::kOverridesWidth, c.overrides);
      t.add_row({std::int64_t(i), c.overrides, std::int64_t(c.world), c.status, c.reason.substr(0, 511),
                 std::string(), c.tokens_per_s, c.mfu, c.step_time, c.peak_bytes, std::nan(""), c.bubble,
                 c.exposed_comm});
    }
    f.write_table(t);
    f.set_attr("/", "status", "complete");
    f.publish();
  }

  fmt::print("strata plan | {} | machine {} | {} device(s), at most {} each | {} layout(s), {} candidate(s) "
             "predicted or refused, {} fit\n",
             deck_path, machine.name, o.world, core::format_bytes(limit), layouts, all.size(), ranked.size());
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
