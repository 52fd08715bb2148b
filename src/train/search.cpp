#include "src/train/search.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "kernels/foundation/error.hpp"
#include "src/deck/deck.hpp"
#include "src/report/h5file.hpp"
#include "src/report/output_path.hpp"
#include "src/report/points.hpp"
#include "strategies/registry.hpp"
#include "src/sim/machine.hpp"
#include "kernels/foundation/clock.hpp"
#include "src/train/paths.hpp"
#include "src/train/bound.hpp"
#include "src/train/run_control.hpp"
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
  double bound = 0;       // the layout's lower bound on its step time (src/train/bound.hpp)
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

// One prediction's figures at its own global batch; per pipeline stage, the
// pipeline's part of the step and its idle time (as measure_bubble takes
// them) and the exposed communication, in seconds.
struct Raw {
  double step = 0, peak = 0;
  std::vector<double> pipe, idle, exposed;
};

Raw raw_figures(const plan::Plan& cfg, const sim::Machine& machine) {
  const Prediction pr = predict(cfg, machine);
  Raw r;
  r.step = pr.step.step_time;
  for (const RankClass& k : pr.estimate.classes)
    r.peak = std::max(r.peak, double(k.memory[core::Pool::device].total_peak));
  for (const prof::Timeline& tl : pr.timelines) {
    StepSpans s;  // a simulation's timeline is one step
    for (const auto& [step, spans] : spans_by_step(tl)) s = spans;
    r.pipe.push_back(s.pipeline(r.step));
    r.idle.push_back(s.idle(r.step));
  }
  for (const auto& st : pr.step.stages) r.exposed.push_back(st.comm_wait);
  return r;
}

// A layout the search chose: its plan and the choices that made it.
struct Layout {
  plan::Plan plan;
  std::vector<Choice> choices;
};

// The overrides a layout's choices make, and how its label says them.
void name_choices(const std::vector<Choice>& choices, std::vector<std::string>* overrides,
                  std::vector<std::string>* label) {
  for (const Choice& c : choices) {
    overrides->push_back(override_of(*c.search, c.value));
    if (std::string x = said(*c.search, c.value); !x.empty()) label->push_back(x);
  }
}

// ---- candidates through a pipe: a worker's results, as bytes ----

void put(std::string& b, const void* p, std::size_t n) { b.append(static_cast<const char*>(p), n); }
void put_u64(std::string& b, std::uint64_t x) { put(b, &x, sizeof x); }
void put_f64(std::string& b, double x) { put(b, &x, sizeof x); }
void put_str(std::string& b, const std::string& x) {
  put_u64(b, x.size());
  b += x;
}

struct Reader {
  const std::string& b;
  std::size_t at = 0;
  std::uint64_t u64() {
    std::uint64_t x = 0;
    std::memcpy(&x, b.data() + at, sizeof x);
    at += sizeof x;
    return x;
  }
  double f64() {
    double x = 0;
    std::memcpy(&x, b.data() + at, sizeof x);
    at += sizeof x;
    return x;
  }
  std::string str() {
    const std::size_t n = std::size_t(u64());
    std::string x = b.substr(at, n);
    at += n;
    return x;
  }
};

// One record: the layout's index, the payload's bytes, then its candidates.
// A worker that fails sends index kFailed and its message.
constexpr std::uint64_t kFailed = ~std::uint64_t(0);

std::string record(std::uint64_t index, const std::vector<Candidate>& cs) {
  std::string p;
  put_u64(p, cs.size());
  for (const Candidate& c : cs) {
    put_str(p, c.label), put_str(p, c.overrides), put_str(p, c.status), put_str(p, c.reason);
    put_u64(p, std::uint64_t(c.world));
    for (double x : {c.tokens_per_s, c.mfu, c.step_time, c.peak_bytes, c.bubble, c.exposed_comm}) put_f64(p, x);
  }
  std::string r;
  put_u64(r, index);
  put_u64(r, p.size());
  return r + p;
}

std::vector<Candidate> candidates_of(const std::string& payload) {
  Reader r{payload};
  std::vector<Candidate> out(std::size_t(r.u64()));
  for (Candidate& c : out) {
    c.label = r.str(), c.overrides = r.str(), c.status = r.str(), c.reason = r.str();
    c.world = int(r.u64());
    for (double* x : {&c.tokens_per_s, &c.mfu, &c.step_time, &c.peak_bytes, &c.bubble, &c.exposed_comm}) *x = r.f64();
  }
  return out;
}

// All of `n` bytes to `fd`; false if the reader is gone.
bool write_fully(int fd, const void* data, std::size_t n) {
  for (std::size_t done = 0; done < n;) {
    const ssize_t w = ::write(fd, static_cast<const char*>(data) + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    done += std::size_t(w);
  }
  return true;
}

// A worker's record to the planner.
void write_all(int fd, const std::string& b) {
  if (!write_fully(fd, b.data(), b.size())) ::_exit(3);  // the planner is gone: nobody to tell
}

using Judged = std::function<void(std::size_t, std::vector<Candidate>)>;

// A process of its own (a fork: its own memory, nothing shared to lock)
// judging the layouts it is sent, one at a time: their indices go down one
// pipe, their candidates come back up another.
class Worker {
 public:
  Worker(pid_t pid, int to, int from) : pid_(pid), to_(to), from_(from) {}
  bool idle() const { return !busy_; }
  int fd() const { return from_; }
  // False if the worker is gone (it failed: what it said comes with its
  // last record).
  bool send(std::size_t index) {
    const std::uint64_t i = index;
    if (!write_fully(to_, &i, sizeof i)) return false;
    busy_ = true;
    return true;
  }
  // No more layouts: the worker ends once its last is sent back.
  void close_commands() {
    if (to_ >= 0) ::close(to_);
    to_ = -1;
  }
  // What has arrived; with `to_end`, everything until the worker is done.
  void receive(bool to_end, const Judged& got) {
    while (from_ >= 0) {
      char chunk[1 << 16];
      const ssize_t n = ::read(from_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!to_end) break;
        pollfd p{from_, POLLIN, 0};
        ::poll(&p, 1, 1000);
        continue;
      }
      if (n <= 0) {
        ::close(from_);
        from_ = -1;
        busy_ = false;
        int status = 0;
        while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
        }
        break;
      }
      buf_.append(chunk, std::size_t(n));
      deliver(got);
    }
  }
  void stop(int signal) const {
    if (from_ >= 0) ::kill(pid_, signal);
  }
  // In a later worker's process: its copies of this worker's pipe ends
  // closed, so that this worker sees the end of its commands.
  void forget() const {
    if (to_ >= 0) ::close(to_);
    if (from_ >= 0) ::close(from_);
  }

 private:
  void deliver(const Judged& got) {
    std::size_t at = 0;
    while (buf_.size() - at >= 16) {
      std::uint64_t index = 0, bytes = 0;
      std::memcpy(&index, buf_.data() + at, 8);
      std::memcpy(&bytes, buf_.data() + at + 8, 8);
      if (buf_.size() - at - 16 < bytes) break;
      const std::string payload = buf_.substr(at + 16, std::size_t(bytes));
      at += 16 + std::size_t(bytes);
      if (index == kFailed) core::runtime_error("a planning worker failed: {}", payload);
      busy_ = false;
      got(std::size_t(index), candidates_of(payload));
    }
    buf_.erase(0, at);
  }

  pid_t pid_;
  int to_, from_;
  bool busy_ = false;
  std::string buf_;
};

// Reads one layout index; false at the end of the commands (or a stop).
bool next_index(int fd, std::size_t* index) {
  std::uint64_t i = 0;
  for (std::size_t done = 0; done < sizeof i;) {
    const ssize_t n = ::read(fd, reinterpret_cast<char*>(&i) + done, sizeof i - done);
    if (n < 0 && errno == EINTR) {
      if (stop_signal() != 0) return false;
      continue;
    }
    if (n <= 0) return false;
    done += std::size_t(n);
  }
  *index = std::size_t(i);
  return true;
}

std::vector<Worker> start_workers(int n, const std::function<std::vector<Candidate>(std::size_t)>& judge) {
  std::vector<Worker> out;
  std::fflush(stdout);
  std::fflush(stderr);
  for (int w = 0; w < n; ++w) {
    int down[2], up[2];
    if (::pipe(down) != 0 || ::pipe(up) != 0)
      core::runtime_error("strata plan: cannot make a pipe: {}", std::strerror(errno));
    const pid_t pid = ::fork();
    if (pid < 0) core::runtime_error("strata plan: cannot start a worker: {}", std::strerror(errno));
    if (pid == 0) {
      ::close(down[1]);
      ::close(up[0]);
      for (const Worker& other : out) other.forget();
      try {
        std::size_t i = 0;
        while (stop_signal() == 0 && next_index(down[0], &i)) write_all(up[1], record(i, judge(i)));
      } catch (const std::exception& e) {
        std::string r;
        put_u64(r, kFailed);
        put_u64(r, std::strlen(e.what()));
        write_all(up[1], r + e.what());
        ::_exit(1);
      }
      ::_exit(0);  // no MPI_Finalize, no exit handlers: the parent owns them
    }
    ::close(down[0]);
    ::close(up[1]);
    ::fcntl(up[0], F_SETFL, ::fcntl(up[0], F_GETFL) | O_NONBLOCK);
    out.emplace_back(pid, down[1], up[0]);
  }
  return out;
}

// The line that says how far the search is: layouts judged, and those left
// under the bound (which the best so far may still prune), fitting
// candidates, the best so far, time spent and left. To stderr, every few
// seconds and at the end, so the table on stdout stays the table.
class Progress {
 public:
  explicit Progress(std::size_t total) : total_(total), start_(prof::now_seconds()), shown_(start_) {}
  void add(const std::vector<Candidate>& cs) {
    ++done_;
    for (const Candidate& c : cs) {
      if (c.status != "complete") continue;
      ++fit_;
      if (c.tokens_per_s > best_) best_ = c.tokens_per_s, best_label_ = c.label;
    }
  }
  bool due() const { return prof::now_seconds() - shown_ >= 5; }
  // `left`: layouts not yet judged whose bound is within the table's reach.
  // The time left is at the rate of the last half minute: the layouts come
  // best bound first, the quick refusals early and the costly pipelines
  // later, so the rate since the start promises too much.
  void show(std::size_t left) {
    const double now = prof::now_seconds();
    shown_ = now;
    rates_.push_back({now, done_});
    while (rates_.size() > 2 && now - rates_[1].first >= kWindow) rates_.erase(rates_.begin());
    const double span = now - rates_.front().first;
    const double rate = span > 0 ? double(done_ - rates_.front().second) / span : 0;
    fmt::print(stderr, "strata plan: {}/{} layouts judged, {} pruned, {} fit, best {}, {:.0f} s, {} left, {}\n", done_,
               total_, total_ - done_ - left, fit_, best(), now - start_, left,
               rate > 0 ? fmt::format("about {:.0f} s at {:.1f} a second", double(left) / rate, rate)
                        : std::string("time left not known yet"));
    std::fflush(stderr);
  }
  // The last line, with the table's counts: a layout judged whose bound is
  // beyond the final reach is counted pruned, as the table has it; a
  // stopped plan's layouts not judged were not reached.
  void finish(std::size_t judged, std::size_t pruned, int stopped) const {
    fmt::print(stderr, "strata plan: {}/{} layouts judged, {} pruned{}, best {}, {:.0f} s\n", judged, total_, pruned,
               stopped ? fmt::format(", {} not reached before {}", total_ - judged - pruned, signal_name(stopped)) : "",
               best(), prof::now_seconds() - start_);
  }

 private:
  static constexpr double kWindow = 30;
  std::string best() const {
    return best_ > 0 ? fmt::format("{:.0f} tokens/s ({})", best_, best_label_) : std::string("none yet");
  }
  std::size_t total_, done_ = 0, fit_ = 0;
  double best_ = 0;
  std::string best_label_;
  double start_, shown_;
  std::vector<std::pair<double, std::size_t>> rates_{{start_, 0}};  // (time, judged) over the last window
};

// The step time a layout must beat to enter a table of `top` rows: the
// top-th best of the fitting candidates so far (infinite until there are
// that many).
class Threshold {
 public:
  explicit Threshold(std::size_t top) : top_(top) {}
  void add(const std::vector<Candidate>& cs) {
    for (const Candidate& c : cs)
      if (c.status == "complete") best_.insert(std::upper_bound(best_.begin(), best_.end(), c.step_time), c.step_time);
    if (best_.size() > top_) best_.resize(top_);
  }
  double operator()() const {
    return best_.size() < top_ ? std::numeric_limits<double>::infinity() : best_.back();
  }

 private:
  std::size_t top_;
  std::vector<double> best_;  // ascending, at most top_
};

}  // namespace

Figures plan_figures(const plan::Plan& cfg, const sim::Machine& machine) {
  Figures f;
  const int per_rank = cfg.micro_batches();
  f.micro_batches = per_rank;
  auto at = [&](int m) {
    plan::Plan c = cfg;
    c.data.global_batch = m * cfg.parallel.dp * cfg.data.micro_batch;
    return c;
  };
  Raw a, b;
  const MicroBatchLine line = micro_batch_line(cfg);
  if (line.whole) {
    a = b = raw_figures(cfg, machine);
    f.simulated = per_rank;
  } else {
    a = raw_figures(at(line.m1), machine);
    b = raw_figures(at(line.m2), machine);
    f.simulated = line.m2;
  }
  f.step_time = line(a.step, b.step);
  f.peak_bytes = line(a.peak, b.peak);
  Prediction rates;
  set_throughput(rates, cfg, machine, f.step_time);
  f.tokens_per_s = rates.tokens_per_s;
  f.mfu = rates.mfu;
  for (std::size_t s = 0; s < a.idle.size(); ++s) {
    const double pipe = line(a.pipe[s], b.pipe[s]);
    if (pipe > 0) f.bubble = std::max(f.bubble, line(a.idle[s], b.idle[s]) / pipe);
  }
  for (std::size_t s = 0; s < a.exposed.size(); ++s) f.exposed_comm = std::max(f.exposed_comm, line(a.exposed[s], b.exposed[s]));
  return f;
}

int search_layouts(const std::string& deck_path, const std::string& text, const std::vector<std::string>& sets,
                   const SearchOptions& o) {
  if (o.world < 1 || o.world > strategies::kMaxWorld)
    core::input_error("--world {}: the devices to plan for, 1 to {} (2^20)", o.world, strategies::kMaxWorld);
  if (o.top < 1) core::input_error("--top {}: at least 1 row", o.top);
  if (o.jobs < 0) core::input_error("--jobs {}: at least 1 process (0 or absent: one per core)", o.jobs);
  sim::Machine machine = sim::load_machine(o.machine);
  const deck::Deck base = deck::parse_deck(deck_path, text, sets);
  const report::ReportPath report =
      report::choose_report_path(o.output, "results/" + base.config.run.name + "-plan.h5", o.force, "plan report",
                                 run_inputs(base, "", machine.path));
  if (!report.problem.empty()) core::input_error("plan report path {}: {}", report.path, report.problem);
  if (!report.note.empty()) fmt::print("{}\n", report.note);
  const std::string& path = report.path;
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

  // Every layout first (cheap: no prediction), so that progress has a total
  // and the work can be shared out.
  std::vector<Layout> layouts;
  std::vector<Choice> choices;
  auto choose = [&](auto& self, std::size_t i, const plan::Plan& so_far) -> void {
    if (i == layout.size()) return layouts.push_back({so_far, choices});
    for (const std::string& v : layout[i]->values(space, so_far)) {
      plan::Plan next = so_far;
      key_of(layout[i]->key).set(next, plan::value_of(key_of(layout[i]->key), v));
      choices.push_back({layout[i], v});
      self(self, i + 1, next);
      choices.pop_back();
    }
  };
  choose(choose, 0, start);

  // A layout: the least recomputation and offload that fits, or its refusal.
  auto judge = [&](const Layout& l) {
    std::vector<Candidate> out;
    std::vector<std::string> over, label;
    name_choices(l.choices, &over, &label);
    std::vector<std::vector<std::string>> values;
    for (const auto* s : fit) {
      values.push_back(s->values(space, l.plan));
      STRATA_CHECK(!values.back().empty(), "the search of {} offers no value", s->key);
    }
    std::vector<std::size_t> at(fit.size(), 0);
    for (;;) {
      std::vector<std::string> more = over, named = label;
      for (std::size_t i = 0; i < fit.size(); ++i) {
        const std::string& v = values[i][at[i]];
        more.push_back(override_of(*fit[i], v));
        if (std::string x = said(*fit[i], v); !x.empty()) named.push_back(x);
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
        const Figures pr = plan_figures(d.config, machine);
        c.peak_bytes = pr.peak_bytes;
        c.tokens_per_s = pr.tokens_per_s;
        c.mfu = pr.mfu;
        c.step_time = pr.step_time;
        c.bubble = pr.bubble;
        c.exposed_comm = pr.exposed_comm;
        fits = pr.peak_bytes <= limit;
        c.status = fits ? "complete" : "skipped";
        if (!fits)
          c.reason = fmt::format("does not fit: device peak {} > {}", core::format_bytes(pr.peak_bytes),
                                 core::format_bytes(limit));
      } catch (const core::Error& e) {
        // Refused by the deck's checks (or not simulable): skipped with its
        // reason, whatever the recomputation and offload.
        c.status = "skipped";
        c.reason = e.kind() == core::ErrorKind::input ? e.what() : fmt::format("cannot simulate: {}", e.what());
        out.push_back(c);
        return out;
      }
      out.push_back(c);
      if (fits) return out;
      // The next combination, the last fit search fastest.
      std::size_t i = fit.size();
      while (i > 0 && ++at[i - 1] == values[i - 1].size()) at[--i] = 0;
      if (i == 0) return out;
    }
  };

  // Each layout's bound, shared work cached; then the layouts best bound
  // first, so that the table fills early and its last row prunes the rest.
  install_stop_signals();
  std::vector<double> bounds(layouts.size(), 0.0);
  {
    StepBound bound(machine);
    double shown = prof::now_seconds();
    const double began = shown;
    for (std::size_t i = 0; i < layouts.size() && stop_signal() == 0; ++i) {
      bounds[i] = bound(layouts[i].plan);
      if (const double now = prof::now_seconds(); now - shown >= 5) {
        fmt::print(stderr, "strata plan: the lower bounds of {}/{} layout(s), {:.0f} s\n", i + 1, layouts.size(),
                   now - began);
        shown = now;
      }
    }
  }
  std::vector<std::size_t> order(layouts.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return bounds[a] < bounds[b]; });

  // Judged by one process per core, each sent the next layout in that
  // order as it finishes one, while its bound is within the table's reach
  // (every layout under --exhaustive). Results are kept by layout, so the
  // table's order is the enumeration's whatever the timing.
  const int workers = std::max(1, std::min<int>(o.jobs > 0 ? o.jobs : int(std::thread::hardware_concurrency()),
                                                int(layouts.size())));
  std::vector<std::optional<std::vector<Candidate>>> judged(layouts.size());
  Progress progress(layouts.size());
  Threshold threshold(o.exhaustive ? layouts.size() + 1 : std::size_t(o.top));
  auto note = [&](std::size_t i, std::vector<Candidate> cs) {
    progress.add(cs);
    threshold.add(cs);
    judged[i] = std::move(cs);
  };
  std::size_t next = 0;
  auto within = [&](std::size_t at) { return at < order.size() && bounds[order[at]] <= threshold(); };
  auto left = [&] {
    std::size_t n = 0;
    for (std::size_t at = next; within(at); ++at) ++n;
    return n;
  };
  if (stop_signal() == 0) {
    std::vector<Worker> pool = start_workers(workers, [&](std::size_t i) { return judge(layouts[i]); });
    // A worker that failed is read to its end, which throws its message.
    ::signal(SIGPIPE, SIG_IGN);
    while (stop_signal() == 0) {
      for (Worker& w : pool)
        if (w.idle() && within(next) && !w.send(order[next++])) {
          w.receive(true, note);
          core::runtime_error("strata plan: a planning worker ended without a word");
        }
      std::vector<pollfd> busy;
      for (const Worker& w : pool)
        if (!w.idle()) busy.push_back({w.fd(), POLLIN, 0});
      if (busy.empty()) break;
      ::poll(busy.data(), busy.size(), 1000);
      for (Worker& w : pool) w.receive(false, note);
      if (progress.due()) progress.show(left());
    }
    for (Worker& w : pool) {
      if (stop_signal() != 0) w.stop(stop_signal());
      w.close_commands();
    }
    for (Worker& w : pool) w.receive(true, note);
  }
  const int stopped = stop_signal();

  // The table: every layout judged whose bound is within the final
  // threshold, and every one beyond it pruned, judged or not (so the table
  // does not depend on which process finished first); a stopped plan
  // leaves out what it had not reached.
  const double reach = threshold();
  std::vector<Candidate> all;
  std::size_t layouts_done = 0, pruned = 0;
  for (std::size_t i = 0; i < layouts.size(); ++i) {
    if (bounds[i] > reach) {
      ++pruned;
      Candidate c;
      std::vector<std::string> over, label;
      name_choices(layouts[i].choices, &over, &label);
      c.overrides = join(over);
      c.label = join(label);
      c.world = o.world;
      c.status = "skipped";
      c.reason = fmt::format("cannot win: a step takes at least {:.4g} s (the layout's lower bound), the {}th best "
                             "predicted takes {:.4g} s",
                             bounds[i], o.top, reach);
      c.bound = bounds[i];
      all.push_back(std::move(c));
      continue;
    }
    if (!judged[i]) continue;
    ++layouts_done;
    for (auto& c : *judged[i]) {
      c.bound = bounds[i];
      all.push_back(std::move(c));
    }
  }
  progress.finish(layouts_done, pruned, stopped);
  std::vector<std::size_t> ranked;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i].status == "complete") ranked.push_back(i);
  std::stable_sort(ranked.begin(), ranked.end(),
                   [&](std::size_t a, std::size_t c) { return all[a].tokens_per_s > all[c].tokens_per_s; });

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
    f.set_attr("/", "memory_limit", std::int64_t(limit));
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
        .col_f64("exposed_comm", "s", "the most time a simulated rank spends blocked in communication")
        .col_f64("bound", "s", "the layout's lower bound on its step time, any recomputation and offload "
                               "(src/train/bound.hpp); above the top-th best prediction, the layout is pruned");
    for (std::size_t i = 0; i < all.size(); ++i) {
      const Candidate& c = all[i];
      STRATA_CHECK(c.overrides.size() < std::size_t(report::kOverridesWidth), "a candidate's overrides exceed {} bytes: {}",
                   report::kOverridesWidth, c.overrides);
      t.add_row({std::int64_t(i), c.overrides, std::int64_t(c.world), c.status, c.reason.substr(0, 511),
                 std::string(), c.tokens_per_s, c.mfu, c.step_time, c.peak_bytes, std::nan(""), c.bubble,
                 c.exposed_comm, c.bound});
    }
    f.write_table(t);
    // Stopped by a signal: the candidates judged so far, and the status says so.
    f.set_attr("/", "status", stopped ? "interrupted" : "complete");
    if (stopped) f.set_attr("/", "interrupted_by", std::string(signal_name(stopped)));
    f.set_attr("/", "layouts", std::int64_t(layouts.size()));
    f.set_attr("/", "layouts_judged", std::int64_t(layouts_done));
    f.set_attr("/", "layouts_pruned", std::int64_t(pruned));
    f.set_attr("/", "exhaustive", o.exhaustive ? "true" : "false");
    f.publish();
  }

  fmt::print("strata plan | {} | machine {} | {} device(s), at most {} each | {} layout(s): {} judged{} ({} "
             "candidate(s): each recomputation and offload tried until one fits), {} pruned by their bound | {} fit\n",
             deck_path, machine.name, o.world, core::format_bytes(limit), layouts.size(), layouts_done,
             stopped ? fmt::format(" before {}", signal_name(stopped)) : "", all.size() - pruned, pruned,
             ranked.size());
  fmt::print("  {:>4} {:>12} {:>6} {:>9} {:>11} {:>7} {:>10}  {}\n", "rank", "tokens/s", "MFU%", "step_ms",
             "peak mem", "bubble", "exposed_s", "layout");
  for (std::size_t r = 0; r < ranked.size() && int(r) < o.top; ++r) {
    const Candidate& c = all[ranked[r]];
    fmt::print("  {:>4} {:>12.0f} {:>6.1f} {:>9.2f} {:>11} {:>7.3f} {:>10.4f}  {}\n", r + 1, c.tokens_per_s,
               100 * c.mfu, 1e3 * c.step_time, core::format_bytes(c.peak_bytes), c.bubble, c.exposed_comm,
               c.label);
  }
  if (ranked.empty() && stopped)
    fmt::print("stopped by {} before any layout was predicted to fit ({} of {} judged)\n", signal_name(stopped),
               layouts_done, layouts.size());
  else if (ranked.empty())
    fmt::print("no layout fits: see {} for why each was refused\n", path);
  fmt::print("report: {} (analysis/strata-report {} --plots DIR: throughput against memory)\n", path, path);
  if (stopped) return interrupted_exit_code(stopped);
  return ranked.empty() ? 3 : 0;
}

}  // namespace strata::train
