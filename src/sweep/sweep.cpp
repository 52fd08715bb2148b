#include "src/sweep/sweep.hpp"

#include <mpi.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "kernels/foundation/clock.hpp"
#include "kernels/foundation/error.hpp"
#include "kernels/foundation/median.hpp"
#include "src/deck/deck.hpp"
#include "plan/keys.hpp"
#include "strategies/registry.hpp"
#include "src/report/h5file.hpp"
#include "src/report/h5read.hpp"
#include "src/report/output_path.hpp"
#include "src/report/points.hpp"

namespace strata::sweep {
namespace fs = std::filesystem;

namespace {

std::vector<std::string> all_key_names() {
  std::vector<std::string> out;
  for (const auto& k : plan::key_table()) out.push_back(k.full_name());
  return out;
}

const plan::KeySpec* key_of(const std::string& full) {
  const auto dot = full.find('.');
  if (dot == std::string::npos) return nullptr;
  return plan::find_key(full.substr(0, dot), full.substr(dot + 1));
}

std::string unknown_key(const std::string& name) {
  std::string msg = fmt::format("unknown deck key '{}'", name);
  if (auto near = plan::closest_name(name, all_key_names())) msg += fmt::format(" (did you mean '{}'?)", *near);
  return msg;
}

// ---- `where` clauses: comparisons of arithmetic over deck keys ----------

struct Val {
  bool is_str = false;
  double num = 0;
  std::string str;
};

// A key's value for a clause: the point's axis value if the key is an axis,
// else the base deck's; null while only checking the syntax.
using Lookup = std::function<Val(const plan::KeySpec&, const std::string& key)>;

class Where {
 public:
  Where(const std::string& text, const Lookup* lookup) : s_(text), lookup_(lookup) {}
  Val eval() {
    Val v = or_expr();
    skip();
    if (i_ != s_.size()) fail(fmt::format("unexpected '{}'", s_.substr(i_)));
    return v;
  }
  // Parses without values (cfg null): the clause is checked once, up front.
  void check() { eval(); }

 private:
  [[noreturn]] void fail(const std::string& why) { throw std::invalid_argument(why); }
  void skip() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool eat(const char* op) {
    skip();
    const std::size_t n = std::strlen(op);
    if (s_.compare(i_, n, op) != 0) return false;
    // Word operators need a word boundary.
    if (std::isalpha(static_cast<unsigned char>(op[0])) && i_ + n < s_.size() &&
        (std::isalnum(static_cast<unsigned char>(s_[i_ + n])) || s_[i_ + n] == '_'))
      return false;
    i_ += n;
    return true;
  }
  static Val num(double x) { return Val{false, x, ""}; }
  double n(const Val& v, const char* op) {
    if (v.is_str) fail(fmt::format("'{}' needs numbers, got the string \"{}\"", op, v.str));
    return v.num;
  }
  Val or_expr() {
    Val v = and_expr();
    while (eat("or")) {
      const Val r = and_expr();
      v = num(n(v, "or") != 0 || n(r, "or") != 0);
    }
    return v;
  }
  Val and_expr() {
    Val v = not_expr();
    while (eat("and")) {
      const Val r = not_expr();
      v = num(n(v, "and") != 0 && n(r, "and") != 0);
    }
    return v;
  }
  Val not_expr() {
    if (eat("not")) {
      const Deeper d(*this);
      return num(n(not_expr(), "not") == 0);
    }
    return cmp();
  }
  Val cmp() {
    Val a = sum();
    for (const char* op : {"==", "!=", "<=", ">=", "<", ">"}) {
      if (!eat(op)) continue;
      const Val b = sum();
      const std::string o = op;
      if (a.is_str || b.is_str) {
        if (!(a.is_str && b.is_str) || (o != "==" && o != "!="))
          fail(fmt::format("strings compare with == and != against strings only"));
        return num((a.str == b.str) == (o == "=="));
      }
      const double x = a.num, y = b.num;
      return num(o == "==" ? x == y : o == "!=" ? x != y : o == "<=" ? x <= y : o == ">=" ? x >= y
                 : o == "<"  ? x < y : x > y);
    }
    return a;
  }
  Val sum() {
    Val v = prod();
    for (;;) {
      if (eat("+")) v = num(n(v, "+") + n(prod(), "+"));
      else if (eat("-")) v = num(n(v, "-") - n(prod(), "-"));
      else return v;
    }
  }
  Val prod() {
    Val v = unary();
    for (;;) {
      if (eat("*")) {
        v = num(n(v, "*") * n(unary(), "*"));
      } else if (eat("/")) {
        const double d = n(unary(), "/");
        v = num(d == 0 ? 0 : n(v, "/") / d);
      } else if (eat("%")) {
        const double d = n(unary(), "%");
        v = num(d == 0 ? 0 : std::fmod(n(v, "%"), d));
      } else {
        return v;
      }
    }
  }
  Val unary() {
    if (eat("-")) {
      const Deeper d(*this);
      return num(-n(unary(), "-"));
    }
    return atom();
  }
  Val atom() {
    skip();
    if (i_ >= s_.size()) fail("the clause ends too early");
    const char c = s_[i_];
    if (c == '(') {
      ++i_;
      const Deeper d(*this);
      Val v = or_expr();
      if (!eat(")")) fail("a '(' is not closed");
      return v;
    }
    if (c == '"' || c == '\'') {
      const std::size_t end = s_.find(c, i_ + 1);
      if (end == std::string::npos) fail("a string is not closed");
      Val v{true, 0, s_.substr(i_ + 1, end - i_ - 1)};
      i_ = end + 1;
      return v;
    }
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
      // strtod: a bare '.' or an exponent past a double's range is said,
      // not thrown as std::stod's own exceptions.
      const char* begin = s_.c_str() + i_;
      char* end = nullptr;
      errno = 0;
      const double x = std::strtod(begin, &end);
      if (end == begin) fail(fmt::format("unexpected '{}'", s_.substr(i_)));
      if (errno == ERANGE || !std::isfinite(x))
        fail(fmt::format("'{}' is past a number's range", s_.substr(i_, std::size_t(end - begin))));
      i_ += std::size_t(end - begin);
      return num(x);
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t j = i_;
      while (j < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[j])) || s_[j] == '_' || s_[j] == '.')) ++j;
      const std::string word = s_.substr(i_, j - i_);
      i_ = j;
      if (word == "true" || word == "false") return num(word == "true");
      const plan::KeySpec* k = key_of(word);
      if (k == nullptr) fail(unknown_key(word));
      if (lookup_ == nullptr) return k->type == plan::KeyType::string ? Val{true, 0, ""} : num(0);
      return (*lookup_)(*k, word);
    }
    fail(fmt::format("unexpected '{}'", s_.substr(i_)));
  }

  // Nesting (parentheses, not, unary minus) is bounded: each level is a
  // frame of this recursive parser, and ten thousand of them overflow the
  // stack.
  static constexpr int kMaxDepth = 100;
  struct Deeper {
    Where& w;
    explicit Deeper(Where& x) : w(x) {
      if (++w.depth_ > kMaxDepth) w.fail(fmt::format("nested more than {} deep (parentheses, not, -)", kMaxDepth));
    }
    ~Deeper() { --w.depth_; }
  };

  std::string s_;
  const Lookup* lookup_;
  std::size_t i_ = 0;
  int depth_ = 0;
};

Val from_value(const plan::Value& v) {
  if (auto p = std::get_if<std::string>(&v)) return Val{true, 0, *p};
  if (auto p = std::get_if<std::int64_t>(&v)) return Val{false, double(*p), ""};
  if (auto p = std::get_if<std::uint64_t>(&v)) return Val{false, double(*p), ""};
  if (auto p = std::get_if<double>(&v)) return Val{false, *p, ""};
  return Val{false, std::get<bool>(v) ? 1.0 : 0.0, ""};
}

// An axis value as written (a TOML literal), for the clauses; a byte-size
// string ("64KiB") of a bytes key counts as its number of bytes.
Val from_literal(const plan::KeySpec& k, const std::string& lit) {
  if (!lit.empty() && lit.front() == '"') {
    const std::string text = toml::parse("v = " + lit)["v"].value_or(std::string());
    if (k.type == plan::KeyType::bytes)
      if (auto b = plan::parse_bytes(text); std::holds_alternative<std::uint64_t>(b))
        return Val{false, double(std::get<std::uint64_t>(b)), ""};
    return Val{true, 0, text};
  }
  if (lit == "true" || lit == "false") return Val{false, lit == "true" ? 1.0 : 0.0, ""};
  // strtod, not std::stod: a literal TOML reads (a subnormal such as
  // 1e-320, an infinity) must not throw out_of_range; the point's own deck
  // check says what is wrong with it.
  return Val{false, std::strtod(lit.c_str(), nullptr), ""};
}

// The ranks a point's layout needs (the product of its mesh's dims): the
// base deck's plan with the point's axis values, before the deck's checks
// (a value its key refuses is left at the base's: the checks refuse the
// point later).
int point_world(plan::Plan p, const std::vector<std::pair<std::string, std::vector<std::string>>>& axes,
                const std::vector<std::string>& values) {
  for (std::size_t a = 0; a < axes.size(); ++a) {
    const plan::KeySpec* k = key_of(axes[a].first);
    if (k == nullptr) continue;
    const Val v = from_literal(*k, values[a].substr(axes[a].first.size() + 1));
    plan::Value typed;
    switch (k->type) {
      case plan::KeyType::integer: typed = std::int64_t(v.num); break;
      case plan::KeyType::unsigned_:
      case plan::KeyType::bytes: typed = std::uint64_t(v.num); break;
      case plan::KeyType::floating: typed = v.num; break;
      case plan::KeyType::boolean: typed = v.num != 0; break;
      case plan::KeyType::string: typed = v.str; break;
    }
    if (v.is_str != (k->type == plan::KeyType::string) || plan::check_value(*k, typed)) continue;
    k->set(p, typed);
  }
  return strategies::layout_of(p).world();
}

std::string literal(const toml::node& v) {
  if (auto x = v.as_integer()) return std::to_string(x->get());
  if (auto x = v.as_floating_point()) return plan::toml_literal(plan::Value(x->get()));
  if (auto x = v.as_boolean()) return x->get() ? "true" : "false";
  if (auto x = v.as_string()) return plan::toml_quote(x->get());
  return "";
}

std::string one_line(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '\n' ? std::string("; ") : std::string(1, c);
  return out;
}

// A `where` clause checked before any point is resolved: an input error
// naming where it came from (the deck's [sweep] table or --where).
void check_clause(const std::string& clause, const std::string& from) {
  try {
    Where(clause, nullptr).check();
  } catch (const std::invalid_argument& e) {
    const std::string shown = clause.size() <= 120 ? clause : clause.substr(0, 100) + "...";
    core::input_error("{}: \"{}\": {}", from, shown, e.what());
  }
}

}  // namespace

Sweep load_sweep(const std::string& deck_path, const std::vector<std::string>& overrides,
                 const std::string& results_dir, const Selection& selection) {
  for (const std::string& clause : selection.where) check_clause(clause, "--where");
  if (selection.limit < 0) core::input_error("--limit {}: the number of points to run, at least 1", selection.limit);
  // The base deck must resolve on its own (its errors are the user's first).
  const deck::Deck base = deck::load_deck(deck_path, overrides);
  toml::table root;
  try {
    root = toml::parse(base.text, deck_path);
  } catch (const toml::parse_error& e) {
    core::input_error("{}:{}: {}", deck_path, e.source().begin.line, e.description());
  }
  const toml::table* t = root["sweep"].as_table();
  if (t == nullptr)
    core::input_error("{}: no [sweep] table: a sweep deck lists axes such as \"parallel.dp\" = [1, 2, 4] under [sweep]",
                      deck_path);
  Sweep s;
  s.deck_path = deck_path;
  s.base_overrides = overrides;
  s.name = base.config.run.name;
  s.repeats = base.config.run.repeats;
  auto where_of = [&](const toml::node& n) {
    return fmt::format("{}:{}: sweep", deck_path, n.source().begin.line);
  };
  std::map<std::string, std::pair<long, long>> axis_line;
  // Axes are the keys other than name, where and world; an unquoted dotted
  // key (parallel.dp = [...]) arrives as nested tables and is flattened.
  std::function<void(const toml::table&, const std::string&)> walk = [&](const toml::table& tab,
                                                                          const std::string& prefix) {
    for (auto&& [k, node] : tab) {
      const std::string key = prefix + std::string(k.str());
      if (prefix.empty() && key == "name") {
        if (!node.is_string()) core::input_error("{}.name must be a string", where_of(node));
        s.name = node.as_string()->get();
        if (!deck::is_file_name(s.name))
          core::input_error("{}.name = \"{}\" must be a file name: not empty, not . or .., without '/', NUL or other "
                            "control characters but tab (it names the sweep's directory, results/<sweep.name>/)",
                            where_of(node), one_line(s.name));
      } else if (prefix.empty() && key == "where") {
        const toml::array* a = node.as_array();
        if (a == nullptr) core::input_error("{}.where must be a list of clauses such as \"parallel.dp * parallel.tp * parallel.pp == 8\"", where_of(node));
        for (auto&& c : *a) {
          if (!c.is_string()) core::input_error("{}.where: every clause must be a string", where_of(node));
          const std::string clause = c.as_string()->get();
          check_clause(clause, fmt::format("{}.where", where_of(node)));
          s.where.push_back(clause);
        }
      } else if (prefix.empty() && key == "world") {
        const toml::array* a = node.as_array();
        if (a == nullptr || a->empty()) core::input_error("{}.world must be a non-empty list of rank counts", where_of(node));
        for (auto&& w : *a) {
          if (!w.is_integer() || w.as_integer()->get() < 1)
            core::input_error("{}.world: every entry must be an integer >= 1, got {}", where_of(node), literal(w));
          s.worlds.push_back(int(w.as_integer()->get()));
        }
      } else if (node.is_table()) {
        walk(*node.as_table(), key + ".");
      } else {
        if (key_of(key) == nullptr) core::input_error("{}: axis {}", where_of(node), unknown_key(key));
        const toml::array* a = node.as_array();
        if (a == nullptr) core::input_error("{}: axis '{}' must be a list of values, e.g. [1, 2]", where_of(node), key);
        if (a->empty()) core::input_error("{}: axis '{}' is empty: give it at least one value", where_of(node), key);
        std::vector<std::string> values;
        for (auto&& v : *a) {
          const std::string lit = literal(v);
          if (lit.empty()) core::input_error("{}: axis '{}': values must be numbers, booleans or strings", where_of(node), key);
          values.push_back(lit);
        }
        s.axes.push_back({key, values});
        axis_line[key] = {node.source().begin.line, node.source().begin.column};
      }
    }
  };
  walk(*t, "");
  // Axes in the deck's order (a TOML table iterates its keys sorted).
  std::stable_sort(s.axes.begin(), s.axes.end(), [&](const auto& a, const auto& b) {
    return axis_line.at(a.first) < axis_line.at(b.first);
  });
  if (s.axes.empty()) core::input_error("{}: [sweep] has no axis: list values for deck keys, e.g. \"parallel.zero\" = [0, 1, 2, 3]", deck_path);
  s.dir = (fs::path(results_dir) / s.name).string();

  // The cartesian product, the last axis fastest; counted in long double
  // first, so that no product of axes overflows or is expanded past the bound.
  long double count = s.repeats;
  for (const auto& a : s.axes) count *= (long double)a.second.size();
  if (count > kMaxRuns) {
    std::string sizes;
    for (const auto& a : s.axes) sizes += fmt::format("{}{} ({})", sizes.empty() ? "" : " x ", a.second.size(), a.first);
    core::input_error("{}: the sweep has {} x {} repeat(s) = {:.4g} runs; at most {} (split it into sweeps, or narrow "
                      "the axes)",
                      deck_path, sizes, s.repeats, double(count), kMaxRuns);
  }
  std::size_t total = 1;
  for (const auto& a : s.axes) total *= a.second.size();
  for (std::size_t i = 0; i < total; ++i) {
    Point p;
    p.index = int(i);
    std::size_t rest = i;
    std::vector<std::string> axis_values(s.axes.size());
    for (std::size_t k = s.axes.size(); k-- > 0;) {
      axis_values[k] = s.axes[k].first + "=" + s.axes[k].second[rest % s.axes[k].second.size()];
      rest /= s.axes[k].second.size();
    }
    p.overrides = axis_values;
    for (const auto& o : axis_values) p.label += (p.label.empty() ? "" : " ") + o;
    p.report = (fs::path(s.dir) / fmt::format("point-{:03d}.h5", i)).string();
    p.reports.push_back(p.report);
    for (int k = 1; k < s.repeats; ++k)
      p.reports.push_back((fs::path(s.dir) / fmt::format("point-{:03d}.r{}.h5", i, k)).string());
    std::vector<std::string> all = overrides;
    all.insert(all.end(), axis_values.begin(), axis_values.end());
    // The filters first, on the axis values (and the base deck's for other
    // keys), so that a point left out on purpose says so; then the deck's
    // own checks on what remains.
    const Lookup lookup = [&](const plan::KeySpec& k, const std::string& key) {
      for (std::size_t a = 0; a < s.axes.size(); ++a)
        if (s.axes[a].first == key) return from_literal(k, axis_values[a].substr(key.size() + 1));
      return from_value(k.get(base.config));
    };
    for (const auto& clause : s.where)
      if (Where(clause, &lookup).eval().num == 0) {
        p.reason = fmt::format("filtered out by where \"{}\"", clause);
        break;
      }
    const int world = point_world(base.config, s.axes, axis_values);
    if (p.reason.empty() && !s.worlds.empty() && std::find(s.worlds.begin(), s.worlds.end(), world) == s.worlds.end())
      p.reason = fmt::format("needs {} ranks, not in sweep.world", world);
    p.filtered = !p.reason.empty();
    for (const auto& clause : selection.where)
      if (p.selected && Where(clause, &lookup).eval().num == 0) p.selected = false;
    if (p.reason.empty()) {
      try {
        const deck::Deck d = deck::parse_deck(deck_path, base.text, all);
        p.world = strategies::layout_of(d.config).world();
        p.valid = true;
      } catch (const core::Error& e) {
        p.reason = one_line(e.what());
      }
    }
    s.points.push_back(std::move(p));
  }
  // --points, then --limit over what is left, in index order.
  if (!selection.points.empty()) {
    std::vector<bool> named(s.points.size(), false);
    const std::string bad = fmt::format("--points \"{}\": give indices and ranges of the sweep's points 0..{}, "
                                        "such as 0-5,9",
                                        selection.points, s.points.size() - 1);
    std::size_t at = 0;
    const std::string& text = selection.points;
    while (at <= text.size()) {
      const std::size_t comma = std::min(text.find(',', at), text.size());
      const std::string item = text.substr(at, comma - at);
      const std::size_t dash = item.find('-');
      const std::string a = item.substr(0, dash), b = dash == std::string::npos ? a : item.substr(dash + 1);
      // Digits only, at most nine: std::stol cannot overflow or take a sign.
      for (const std::string* n : {&a, &b})
        if (n->empty() || n->size() > 9 || n->find_first_not_of("0123456789") != std::string::npos)
          core::input_error("{}", bad);
      const long first = std::stol(a), last = std::stol(b);
      if (first > last || last >= long(s.points.size())) core::input_error("{}", bad);
      for (long i = first; i <= last; ++i) named[std::size_t(i)] = true;
      at = comma + 1;
    }
    for (Point& p : s.points) p.selected = p.selected && named[std::size_t(p.index)];
  }
  int taken = 0;
  for (Point& p : s.points) {
    p.selected = p.selected && p.valid;
    if (p.selected && selection.limit > 0 && taken++ >= selection.limit) p.selected = false;
  }
  return s;
}

std::string describe(const Sweep& s, bool all) {
  int valid = 0, selected = 0;
  std::string out;
  for (const auto& p : s.points) {
    valid += p.valid;
    selected += p.selected;
    if (!p.selected && !all) continue;
    const char* status = p.selected ? "valid" : p.valid ? "unchosen" : "skipped";
    out += fmt::format("{:>4}  {:>5}  {:<8}  {}{}\n", p.index, p.world > 0 ? std::to_string(p.world) : "-", status,
                       p.label, p.valid ? "" : "\n               " + p.reason);
  }
  const int left = int(s.points.size()) - selected;
  return fmt::format("sweep '{}' from {}: {} point(s), {} valid{}{}; reports in {}/\n point  ranks  status    overrides\n{}",
                     s.name, s.deck_path, s.points.size(), valid,
                     selected < valid ? fmt::format(", {} chosen by --where, --points or --limit", selected) : "",
                     left == 0 || all ? "" : fmt::format(" (--all adds the {} {} and why)", left, selected < valid ? "others" : "skipped"),
                     s.dir, out);
}

namespace {

std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> out;
  std::string w;
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (!w.empty()) out.push_back(w), w.clear();
    } else {
      w += c;
    }
  }
  if (!w.empty()) out.push_back(w);
  return out;
}

// Runs argv as a child, its output going to `log`, with the launcher
// variables of an enclosing MPI job removed (so a driver started by mpiexec
// launches clean jobs); returns its exit status (128 + signal if killed).
// The child leads a process group of its own: a stop the driver receives is
// sent to the whole job (the launcher and what it started), once, and the
// driver waits for the job to end (its ranks write an interrupted report).
int run_child(const std::vector<std::string>& argv, const std::string& log, const std::function<int()>& stopped) {
  const pid_t pid = fork();
  if (pid < 0) core::runtime_error("fork failed: {}", std::strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    std::signal(SIGPIPE, SIG_DFL);  // the driver ignores it; the launcher should not
    for (const char* v : {"PMI_FD", "PMI_RANK", "PMI_SIZE", "PMI_PORT", "PMI_ID", "MPI_LOCALRANKID",
                          "MPI_LOCALNRANKS", "PMIX_RANK", "PMIX_NAMESPACE"})
      unsetenv(v);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "strata sweep: cannot start %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);  // also here: whichever of the two runs first
  int status = 0, forwarded = 0;
  for (;;) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) break;
    if (const int sig = stopped ? stopped() : 0; sig != 0 && forwarded == 0) {
      kill(-pid, sig);
      forwarded = sig;
    }
    usleep(50 * 1000);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string log_of(const std::string& report_path) { return report_path.substr(0, report_path.size() - 3) + ".log"; }

// A point whose job died before publishing its report: the first rank's
// message from its log, else what the driver wrote there of its launcher.
std::string failure_in_log(const std::string& report_path) {
  std::ifstream log(log_of(report_path));
  std::string driver;
  for (std::string line; std::getline(log, line);) {
    if (line.rfind("strata: ", 0) == 0 && line.find("failed: ") != std::string::npos) return line;
    if (driver.empty() && line.rfind("strata sweep: ", 0) == 0) driver = line;
  }
  return !driver.empty() ? driver : "the run ended before publishing its report";
}

// A point's figures over its complete runs, as the index has them: the
// medians of tokens/s, MFU and step time, the largest peak, the least and
// most tokens/s, and the spread (max - min) / median of the step times.
struct PointFigures {
  double tokens_per_s = 0, mfu = 0, step_time = 0, peak = 0, tokens_min = 0, tokens_max = 0, spread = 0;
};
PointFigures point_figures(const std::vector<report::Headline>& done) {
  PointFigures f;
  if (done.empty()) return f;
  std::vector<double> tps, mfu, time;
  for (const auto& h : done) {
    tps.push_back(h.tokens_per_s), mfu.push_back(h.mfu), time.push_back(h.step_time);
    f.peak = std::max(f.peak, h.peak_bytes_total);
  }
  f.tokens_per_s = core::median(tps), f.mfu = core::median(mfu), f.step_time = core::median(time);
  f.tokens_min = *std::min_element(tps.begin(), tps.end()), f.tokens_max = *std::max_element(tps.begin(), tps.end());
  if (time.size() > 1 && f.step_time > 0)
    f.spread = (*std::max_element(time.begin(), time.end()) - *std::min_element(time.begin(), time.end())) / f.step_time;
  return f;
}

// The complete points ranked by throughput, with the index's figures, from
// the headlines of the complete reports the sweep saw (by path).
void print_ranking(const Sweep& s, const std::map<std::string, report::Headline>& complete) {
  struct Row {
    const Point* p;
    PointFigures f;
  };
  std::vector<Row> rows;
  for (const auto& p : s.points) {
    if (!p.valid) continue;
    std::vector<report::Headline> done;
    for (const std::string& r : p.reports)
      if (const auto h = complete.find(r); h != complete.end()) done.push_back(h->second);
    if (!done.empty()) rows.push_back({&p, point_figures(done)});
  }
  if (rows.empty()) return;
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Row& a, const Row& b) { return a.f.tokens_per_s > b.f.tokens_per_s; });
  fmt::print("complete points by throughput{}:\n  {:>5} {:>5} {:>12} {:>6} {:>10} {:>11}  {}\n",
             s.repeats > 1 ? " (medians of their runs)" : "", "point", "ranks", "tokens/s", "MFU%", "step_ms",
             "peak mem", "overrides");
  for (const Row& r : rows)
    fmt::print("  {:>5} {:>5} {:>12.0f} {:>6.1f} {:>10.2f} {:>11}  {}\n", r.p->index, r.p->world, r.f.tokens_per_s,
               100 * r.f.mfu, 1e3 * r.f.step_time, core::format_bytes(r.f.peak), r.p->label);
}

}  // namespace

int run_sweep(const Sweep& s, const RunOptions& opts) {
  int limit = opts.world;
  if (limit == 0)
    if (const char* n = std::getenv("SLURM_NTASKS")) limit = std::atoi(n);
  std::string launcher = opts.launcher;
  if (launcher.empty()) launcher = std::getenv("SLURM_JOB_ID") ? "srun --mpi=pmi2 -n {n}" : "mpiexec -n {n}";
  std::error_code ec;
  const std::string exe = fs::read_symlink("/proc/self/exe", ec).string();
  if (ec) core::runtime_error("cannot find the strata executable: {}", ec.message());
  fs::create_directories(s.dir, ec);
  if (ec) core::input_error("cannot create {}: {}", s.dir, ec.message());
  int failed = 0;
  auto stop = [&] { return opts.stopped ? opts.stopped() : 0; };
  // One line per run, counted k/N with the time so far and the time left
  // at this pace; the invalid points in one line (--list --all says why).
  int invalid = 0, filtered = 0, unchosen = 0, runs = 0, done = 0;
  for (const auto& p : s.points) {
    invalid += !p.valid && !p.filtered;
    filtered += p.filtered;
    unchosen += p.valid && !p.selected;
    if (p.selected && (limit == 0 || p.world <= limit)) runs += int(p.reports.size());
  }
  std::string others;
  if (filtered > 0) others += fmt::format("; {} left out by the deck's where or world", filtered);
  if (invalid > 0) others += fmt::format("; {} skipped as invalid", invalid);
  if (unchosen > 0) others += fmt::format("; {} valid not chosen (--where, --points, --limit)", unchosen);
  fmt::print("sweep '{}': {} run(s) of {} point(s){}{}\n", s.name, runs, s.points.size(), others,
             invalid + filtered > 0 ? fmt::format(" (strata sweep {} --list --all says why)", s.deck_path) : "");
  const auto started = std::chrono::steady_clock::now();
  std::map<std::string, report::Headline> complete;  // report -> its headline
  const auto pace = [&] {
    const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return fmt::format("{} elapsed, ETA {}", prof::format_duration(spent),
                       prof::format_duration(done > 0 ? spent / done * (runs - done) : 0));
  };
  for (const auto& p : s.points) {
    if (stop() != 0) break;  // the points not reached stay not_run
    const std::string point_head = fmt::format("point {:>3} [{}]", p.index, p.label);
    if (!p.selected) continue;
    if (limit > 0 && p.world > limit) {
      fmt::print("{}: not run: needs {} ranks, the allocation has {}\n", point_head, p.world, limit);
      continue;
    }
    bool point_failed = false;
    for (std::size_t k = 0; k < p.reports.size() && stop() == 0; ++k) {
      const std::string& report = p.reports[k];
      ++done;
      const std::string head = fmt::format("[{}/{}] {}", done, runs,
                                           s.repeats > 1 ? fmt::format("{} run {}/{}", point_head, k + 1, s.repeats)
                                                         : point_head);
      const auto h = report::read_headline(report);
      const bool partial = fs::exists(report + ".partial", ec);
      if (h && h->status == "complete") {
        complete[report] = *h;
        fmt::print("{}: complete already ({:.0f} tokens/s), skipped\n", head, h->tokens_per_s);
        continue;
      }
      if ((partial || (h && h->status != "complete")) && !opts.retry_failed) {
        fmt::print("{}: failed before, skipped (--retry-failed runs it again)\n", head);
        point_failed = true;
        continue;
      }
      // Run again (--retry-failed): the failed report goes, so that the
      // index tells of this run, not of the last.
      fs::remove(report + ".partial", ec);
      fs::remove(report, ec);
      std::vector<std::string> argv;
      for (const auto& w : split_words(launcher)) {
        std::string a = w;
        for (std::size_t at; (at = a.find("{n}")) != std::string::npos;) a.replace(at, 3, std::to_string(p.world));
        argv.push_back(a);
      }
      argv.insert(argv.end(), {exe, "run", s.deck_path});
      for (const auto& o : s.base_overrides) argv.insert(argv.end(), {"--set", o});
      for (const auto& o : p.overrides) argv.insert(argv.end(), {"--set", o});
      argv.insert(argv.end(), {"--output", report});
      const std::string log = log_of(report);
      fmt::print("{}: running on {} rank(s), output in {}\n", head, p.world, log);
      std::fflush(stdout);
      const int rc = run_child(argv, log, opts.stopped);
      const auto after = report::read_headline(report);
      if (stop() != 0) {
        fmt::print("{}: stopped ({}: exit status {}{})\n", head, ::strsignal(stop()), rc,
                   after ? ", its report says " + after->status : ", no report");
      } else if (rc == 0 && after && after->status == "complete") {
        complete[report] = *after;
        fmt::print("{}: complete ({:.0f} tokens/s) | {}\n", head, after->tokens_per_s, pace());
      } else {
        // What the launcher did goes into the point's log, where the index
        // finds why a point without a report failed.
        std::ofstream(log, std::ios::app) << fmt::format(
            "strata sweep: the launcher ({}) exited with status {}{}\n", argv.front(), rc,
            after ? "" : " and published no report");
        fmt::print("{}: FAILED (exit status {}, see {}); the sweep goes on | {}\n", head, rc, log, pace());
        point_failed = true;
      }
      std::fflush(stdout);
    }
    failed += point_failed;
  }
  print_ranking(s, complete);
  return failed;
}

void write_index(const Sweep& s) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  STRATA_CHECK(initialised, "write_index needs MPI initialised");
  const std::string path = (fs::path(s.dir) / "index.h5").string();
  if (const std::string why = report::output_file_problem(path, "sweep index"); !why.empty())
    core::input_error("sweep index {}: {}", path, why);
  report::H5File f(MPI_COMM_SELF, path);
  f.set_attr("/", "schema", std::string("strata-sweep"));
  f.set_attr("/", "schema_version", std::int64_t(1));
  f.set_attr("/", "sweep", s.name);
  f.set_attr("/", "deck_path", s.deck_path);
  std::string axes;
  for (const auto& [k, v] : s.axes) {
    axes += (axes.empty() ? "" : "; ") + k + " = [";
    for (std::size_t i = 0; i < v.size(); ++i) axes += (i ? ", " : "") + v[i];
    axes += "]";
  }
  f.set_attr("/", "axes", axes);
  std::string where;
  for (const auto& w : s.where) where += (where.empty() ? "" : "; ") + w;
  f.set_attr("/", "where", where);
  report::PointColumns what;
  what.point = "0-based point index (the report is point-NNN.h5)";
  what.overrides = "the axes' section.key=value, space-separated";
  what.world = "ranks the point needs (the product of its mesh's dims; 0 if it does not resolve)";
  what.status =
      "complete, failed (its report says so, was left unfinished, or was never published by a launched run), "
      "diverged or interrupted (its report says where), not_run (valid, not yet launched) or skipped (invalid: "
      "see reason)";
  what.reason = "why a point is skipped, or a failed run's error";
  what.report = "path of the point's report";
  what.tokens_per_s = "the report's /summary/tokens_per_s; with run.repeats, the median over the complete runs";
  what.mfu = "model FLOP utilisation (median over the complete runs)";
  what.step_time = "median step time, the slowest rank's (median over the complete runs)";
  what.peak_bytes = "the report's /summary/peak_bytes_total: the largest rank's (largest over the runs)";
  what.final_loss = "loss of the last step (of the first run)";
  report::Table t =
      report::points_table("one row per point of the sweep: its overrides, status and headline figures", what);
  t.col_i64("runs", "1", "complete runs of the point (run.repeats asked for)")
      .col_f64("tokens_per_s_min", "tokens/s", "the least tokens/s of the complete runs")
      .col_f64("tokens_per_s_max", "tokens/s", "the most tokens/s of the complete runs")
      .col_f64("step_time_spread", "1", "(max - min) / median of the complete runs' step times; 0 for one run");
  std::error_code ec;
  for (const auto& p : s.points) {
    std::string status = "skipped", reason = p.reason;
    std::vector<report::Headline> done;
    report::Headline first;
    if (p.valid) {
      status = "complete";
      for (std::size_t k = 0; k < p.reports.size(); ++k) {
        const auto r = report::read_headline(p.reports[k]);
        if (r && k == 0) first = *r;
        if (r && r->status == "complete") {
          done.push_back(*r);
          continue;
        }
        if (status != "complete") continue;  // the first run that is not complete says why
        if (r && (r->status == "diverged" || r->status == "interrupted")) {
          status = r->status;  // published, stopped early: its report says where
          reason = "the run " + r->status + " (see its report)";
        } else if (r || fs::exists(p.reports[k] + ".partial", ec) || fs::exists(log_of(p.reports[k]), ec)) {
          // A report that failed, one left unfinished, or none though the
          // driver ran the point (its launcher failed, or published nothing).
          status = "failed";
          reason = r && !r->error.empty() ? r->error : failure_in_log(p.reports[k]);
        } else {
          status = "not_run";
        }
      }
    }
    const PointFigures fig = point_figures(done);
    if (reason.size() > 511) reason.resize(511);
    t.add_row({std::int64_t(p.index), p.label.substr(0, 255), std::int64_t(p.world), status, reason,
               p.report.substr(0, 255), done.empty() ? first.tokens_per_s : fig.tokens_per_s,
               done.empty() ? first.mfu : fig.mfu, done.empty() ? first.step_time : fig.step_time,
               done.empty() ? first.peak_bytes_total : fig.peak, first.final_loss, std::int64_t(done.size()),
               fig.tokens_min, fig.tokens_max, fig.spread});
  }
  f.write_table(t);
  f.publish();
}

}  // namespace strata::sweep
